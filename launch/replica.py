"""``python -m launch.replica``: one data-parallel replica of ``tprun
serve`` (``launch.data_parallel``): the parent's parsed serve options come
as one JSON object on stdin, and the replica serves them as ``tprun``
would (its engine endpoint, no HTTP), with the same exit codes and lines.

It dies with its parent (``TPRUN_PARENT_PID``), checked before anything
is imported, so a parent killed during start-up leaves no replica behind.
"""

import argparse
import json
import sys

from worker.parent_death import die_with_parent_from_env


def main() -> int:
    die_with_parent_from_env()
    args = argparse.Namespace(**json.loads(sys.stdin.read()))
    from launch.cli import main as tprun

    return tprun(parsed=args)


if __name__ == "__main__":
    sys.exit(main())
