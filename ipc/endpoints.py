"""Where the sockets live: ipc:// files in a directory only the owner can
read; and whether a TCP server can listen at an address (``bind_error``)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass

import zmq

# A Unix socket's address holds at most this many bytes of path (sun_path).
IPC_PATH_MAX = getattr(zmq, "IPC_PATH_MAX_LEN", 107)

# tprun-PID-XXXXXXXX and tprun-KIND-PID-XXXXXXXX (``private_directory``'s
# kind, "serve-" or "dp-"): PID is the launch that owns it.
_PRIVATE_DIR = re.compile(r"tprun-(?:[a-z]+-)?(\d+)-[^-]+")
_KIND = re.compile(r"[a-z]+-")


def bind_error(addresses: list[tuple]) -> OSError | None:
    """None when a TCP server can bind one of ``addresses`` (entries of
    ``socket.getaddrinfo``) now, with ``SO_REUSEADDR`` as servers bind;
    else why not: an address in use over any other error, since another
    port is the fix the user can make. The probe is closed at once."""
    error = None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                return None
            except OSError as e:
                error = e if error is None or e.errno == errno.EADDRINUSE else error
    return error


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _remove_private_directories(owned_by) -> list[str]:
    """Remove this user's private directories in the temp folder whose
    owner pid ``owned_by(pid)`` selects; returns the paths removed."""
    root = tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _PRIVATE_DIR.fullmatch(name)
        path = os.path.join(root, name)
        if match is None or not owned_by(int(match.group(1))):
            continue
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def remove_stale_directories() -> list[str]:
    """Remove the private directories of launches that are gone (killed
    before their cleanup ran): only this user's, only those whose owner pid
    is dead. Returns the paths removed."""
    return _remove_private_directories(lambda pid: not _alive(pid))


def remove_own_directories() -> list[str]:
    """Remove this process's private directories: for a launch about to
    exit whose own cleanup was cut short (a second Ctrl-C during the first
    one's shutdown). Returns the paths removed."""
    return _remove_private_directories(lambda pid: pid == os.getpid())


def check_private_directory(directory: str) -> None:
    """``ValueError`` unless ``directory`` is missing (``Endpoints.create``
    makes it, mode 0700) or is a directory of this user that no one else may
    read, write or enter: whoever can reach the sockets in it can talk to
    the executor or pose as a worker."""
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ValueError(f"{directory}: {e.strerror or e}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{directory} is not a directory")
    if info.st_uid != os.getuid():
        raise ValueError(f"{directory} belongs to another user; it must be a directory of "
                         "yours that only you can access")
    if info.st_mode & 0o077:
        raise ValueError(f"{directory} must be private to its owner (mode "
                         f"{stat.S_IMODE(info.st_mode):o}; chmod 700 {directory})")


def check_socket_paths(directory: str, *names: str) -> None:
    """``ValueError`` unless every socket ``directory/name`` fits a Unix
    socket's address (``IPC_PATH_MAX`` bytes): ZeroMQ would refuse to bind
    it, and the message should name what to shorten."""
    for name in names:
        path = os.path.join(directory, name)
        size = len(os.fsencode(path))
        if size > IPC_PATH_MAX:
            raise ValueError(f"the socket path {path} is {size} bytes, more than "
                             f"the {IPC_PATH_MAX} a Unix socket's address holds: use a shorter "
                             f"directory (TMPDIR, or the directory given for the sockets)")


def private_directory(kind: str = "", sockets: tuple[str, ...] = ()) -> str:
    """A new directory (mode 0700) in the temp folder named after this
    process (``tprun-{kind}{pid}-XXXXXXXX``, ``kind`` empty or lowercase
    letters and a dash), so a later launch can tell it is stale once this
    process is gone; stale ones are removed first.
    ``sockets``: the names of the sockets it will hold; where one would not
    fit a socket address, the directory is removed again and
    ``check_socket_paths``'s error raised."""
    if kind and _KIND.fullmatch(kind) is None:
        raise ValueError(f"a private directory's kind is lowercase letters and a dash, "
                         f"got {kind!r}")
    remove_stale_directories()
    directory = tempfile.mkdtemp(prefix=f"tprun-{kind}{os.getpid()}-")  # mkdtemp makes it 0700
    try:
        check_socket_paths(directory, *sockets)
    except ValueError:
        os.rmdir(directory)
        raise
    return directory


# The executor's sockets in its private directory, in ``Endpoints``' field order.
SOCKET_NAMES = ("broadcast", "reply", "output")


@dataclass(frozen=True)
class Endpoints:
    """The executor's three endpoints (it binds them; workers connect).

    ``broadcast``: PUB, executor -> every worker. ``reply``: PULL, worker ->
    executor (control replies, heartbeats, a rank's step errors).
    ``output``: PULL, the output rank's copy thread -> the thread that waits
    for the step (step outputs). ``directory`` is mode 0700 and removed by
    ``cleanup``.
    """

    directory: str
    broadcast: str
    reply: str
    output: str
    owns_directory: bool = True

    @classmethod
    def create(cls, directory: str | None = None) -> Endpoints:
        """Endpoints in a fresh private directory, or in ``directory`` (made
        0700 if new; refused if others can read it) for workers started
        elsewhere, e.g. by torchrun, that are told where to connect."""
        owns_directory = directory is None
        if directory is None:
            directory = private_directory(sockets=SOCKET_NAMES)
        else:
            check_socket_paths(directory, *SOCKET_NAMES)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            check_private_directory(directory)
        os.chmod(directory, 0o700)
        broadcast, reply, output = (f"ipc://{directory}/{name}" for name in SOCKET_NAMES)
        return cls(directory=directory, broadcast=broadcast, reply=reply, output=output,
                   owns_directory=owns_directory)

    def cleanup(self) -> None:
        """Remove the socket files, then the directory if this made it."""
        for endpoint in (self.broadcast, self.reply, self.output):
            try:
                os.unlink(endpoint[len("ipc://") :])
            except FileNotFoundError:
                pass
        if self.owns_directory:
            try:
                os.rmdir(self.directory)
            except OSError:
                pass
