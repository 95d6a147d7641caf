"""Every subcommand, registered from this one list."""

from __future__ import annotations

from .attach import attach
from .doctor import doctor
from .export import export
from .flame import flame
from .ps import ps
from .quota import quota
from .report import report
from .run import run
from .timeline import timeline
from .top import top
from .watch import watch

COMMANDS = [doctor, ps, quota, attach, run, report, flame, timeline, export, watch, top]
