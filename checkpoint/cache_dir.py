"""tprun's cache directory and the one way a model directory is written
into it.

``ensure_written(root, name, write)`` returns ``root/name``, calling
``write(tmp)`` first when it is not there yet. The directory is built under a
temporary name and renamed into place, so a reader never sees a partial one
and concurrent writers are harmless: the first rename wins, the others
discard their copies. A directory counts as present once its
``config.json`` is: every writer writes that file last.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

COMPLETE_MARKER = "config.json"


def default_cache_dir() -> str:
    """$TPRUN_CACHE, else ~/.cache/tprun."""
    return os.environ.get("TPRUN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "tprun")


def is_complete(model_dir: str) -> bool:
    return os.path.isfile(os.path.join(model_dir, COMPLETE_MARKER))


def ensure_written(root: str, name: str, write: Callable[[str], None]) -> str:
    """``root/name``, written by ``write`` (into an empty directory) on first use."""
    final = os.path.join(root, name)
    if is_complete(final):
        return final
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root)
    except OSError as e:  # say which directory, and how to choose another
        raise OSError(f"cannot write the model cache {root} ({e.strerror or e}): set "
                      f"TPRUN_CACHE to a directory you can write") from None
    try:
        write(tmp)
        os.rename(tmp, final)
    except OSError:
        if not is_complete(final):
            raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final
