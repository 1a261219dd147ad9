"""Reading the torch profiler's traces that workers write (tests of
``worker.torch_profiler``): each gzipped Chrome trace's events, by file name."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

# vLLM's trace name of a worker (after an optional ``PREFIX_``), as
# torch's tensorboard handler completes it.
TRACE = re.compile(r"^(?:(?P<prefix>.+)_)?dp(?P<dp>\d)_pp0_tp(?P<tp>\d)_dcp0_ep0_"
                   r"rank(?P<rank>\d)\.\d+\.pt\.trace\.json\.gz$")


def traces(directory) -> dict[str, list[dict]]:
    """Each trace file's name -> its events (the file must be a gzipped
    Chrome trace: a JSON object with ``traceEvents``)."""
    found = {}
    for path in glob.glob(os.path.join(directory, "*.pt.trace.json.gz")):
        with gzip.open(path, "rt") as f:
            found[os.path.basename(path)] = json.load(f)["traceEvents"]
    return found


def names(events: list[dict]) -> set[str]:
    """The events' names (operators such as ``aten::mm`` among them)."""
    return {e.get("name") for e in events}
