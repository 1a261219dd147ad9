"""The ``tprun`` console script and ``python -m launch``.

Ctrl-C is handled from the first instruction: before ``launch.cli`` (and
torch, which it imports) is loaded, an interrupt has nothing to clean up,
so it is one line and exit code 130, never an import traceback. Once
``main`` runs, its own handler takes over (workers stopped, files removed).
"""

import os
import signal
import sys


def _interrupted_early(_signum, _frame) -> None:
    sys.stderr.write("tprun: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def entry() -> None:
    """``main``, then exit. After Ctrl-C or SIGTERM (130, 143) the workers
    are already stopped and every file removed; the interpreter's own
    teardown (torch's, seconds long) is skipped so the exit is prompt, and
    a further signal (``main`` gives back the handlers it found) is
    ignored, so the launch ends with its one line and its code."""
    signal.signal(signal.SIGINT, _interrupted_early)
    from launch.cli import main

    code = main()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
