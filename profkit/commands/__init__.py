"""Every subcommand, registered from this one list."""

from __future__ import annotations

from .doctor import doctor
from .ps import ps
from .quota import quota

COMMANDS = [doctor, ps, quota]
