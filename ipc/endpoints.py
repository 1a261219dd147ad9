"""Where the sockets live: ipc:// files in a directory only the owner can read."""

from __future__ import annotations

import os
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
    owns_directory: bool = True

    @classmethod
    def create(cls, directory: str | None = None) -> Endpoints:
        """Endpoints in a fresh private directory, or in ``directory`` (made
        0700 if new; refused if others can read it) for workers started
        elsewhere, e.g. by torchrun, that are told where to connect."""
        owns_directory = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="tprun-")  # mkdtemp makes it 0700
        else:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if os.stat(directory).st_mode & 0o077:
                raise ValueError(f"{directory} must be private to its owner (chmod 700)")
        os.chmod(directory, 0o700)
        return cls(
            directory=directory,
            broadcast=f"ipc://{directory}/broadcast",
            reply=f"ipc://{directory}/reply",
            owns_directory=owns_directory,
        )

    def cleanup(self) -> None:
        """Remove the socket files, then the directory if this made it."""
        for endpoint in (self.broadcast, self.reply):
            try:
                os.unlink(endpoint[len("ipc://") :])
            except FileNotFoundError:
                pass
        if self.owns_directory:
            try:
                os.rmdir(self.directory)
            except OSError:
                pass
