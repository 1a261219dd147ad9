"""Where the sockets live: ipc:// files in a directory only the owner can read."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoints:
    """The executor's two endpoints (it binds both; workers connect).

    ``broadcast``: PUB, executor -> every worker. ``reply``: PULL, worker ->
    executor. ``directory`` is mode 0700 and removed by ``cleanup``.
    """

    directory: str
    broadcast: str
    reply: str

    @classmethod
    def create(cls) -> Endpoints:
        directory = tempfile.mkdtemp(prefix="tprun-")  # mkdtemp makes it 0700
        os.chmod(directory, 0o700)
        return cls(
            directory=directory,
            broadcast=f"ipc://{directory}/broadcast",
            reply=f"ipc://{directory}/reply",
        )

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
