"""Make the kernel kill this process when its parent dies (Linux)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent_from_env() -> None:
    """If the spawner asked for it (``TPRUN_PARENT_PID``), die with it.

    Called first thing in ``python -m worker``, before torch is imported, so
    a parent killed during start-up cannot leave the worker behind.
    """
    parent = os.environ.get("TPRUN_PARENT_PID")
    if parent:
        die_with_parent(int(parent))


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process as soon as its parent exits.

    If the parent already died before the call, exit now. Off Linux only
    the daemon's once-a-second parent check remains.
    """
    if os.getppid() != expected_parent:
        os._exit(1)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except OSError as e:
        logger.warning("cannot set the parent-death signal: %s", e)
    if os.getppid() != expected_parent:
        os._exit(1)
