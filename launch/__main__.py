"""``python -m launch`` is ``tprun``."""

from launch.cli import entry

entry()
