"""``python -m launch`` is ``tprun``."""

import sys

from launch.cli import main

sys.exit(main())
