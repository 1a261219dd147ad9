"""``python -m worker``: start one worker daemon (see worker.daemon)."""

import sys

from worker.daemon import main

sys.exit(main())
