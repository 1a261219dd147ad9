"""``python -m launch`` is ``tprun``."""

from launch.entry import entry

entry()
