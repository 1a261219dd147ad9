"""``python -m worker``: start one worker daemon (see worker.daemon)."""

import sys

from worker.parent_death import die_with_parent_from_env

die_with_parent_from_env()  # before the heavy imports below

from worker.daemon import main  # noqa: E402

sys.exit(main())
