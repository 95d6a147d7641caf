"""Every subcommand, registered from this one list."""

from __future__ import annotations

from .attach import attach
from .doctor import doctor
from .ps import ps
from .quota import quota
from .report import report
from .run import run

COMMANDS = [doctor, ps, quota, attach, run, report]
