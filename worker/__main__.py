"""``python -m worker``: start one worker daemon (see worker.daemon)."""

import logging
import os
import signal
import sys

from worker.job_signals import defer_to_executor
from worker.parent_death import die_with_parent_from_env

die_with_parent_from_env()  # before the heavy imports below
# A SIGTERM that reached the executor too is the executor's to act
# on: it stops this worker between steps. Before any thread starts.
defer_to_executor()
# Ctrl-C in a terminal reaches the whole process group: the executor decides
# when workers stop (a shutdown call, or its own death), not the keyboard.
signal.signal(signal.SIGINT, signal.SIG_IGN)
# Blocked since the executor spawned this process (executor/multiproc.py:
# spawn_worker); ignored now, so a Ctrl-C pending meanwhile is dropped.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

from worker.daemon import main  # noqa: E402

code = main()
# main() closed everything the daemon owns (sockets, process group, device
# memory). The interpreter's own teardown after torch can take seconds, long
# enough for the executor to give up waiting and kill the worker: skip it.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
