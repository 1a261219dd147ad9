"""Authenticated framing for the engine endpoint: a per-launch secret and HMAC-SHA256.

``tprun serve`` makes a random secret at start and writes it, hex-encoded,
to key files only the owner can read (``write_key_file``). Every message on
the engine endpoint, both ways, is two ZeroMQ frames::

    [mac, payload]      mac = HMAC-SHA256(secret, label + payload), 32 bytes

where ``label`` names the direction (``REQUEST_LABEL`` client -> server,
``REPLY_LABEL`` server -> client), so a message cannot be reflected back to
the side that sent it. The receiver checks the MAC with
``hmac.compare_digest`` before it decodes anything; a message without a
valid MAC is refused: dropped unread, counted and logged (``RefusalLog``).

Invariants: ``Authenticator.unseal`` returns a payload only if its MAC was
made with the same secret for that direction; it never looks inside the
payload. What this does not do: encrypt (anyone who can read the traffic
can read the prompts), stop a replay by someone who can record traffic, or
stop ZeroMQ from buffering a peer's frames (each below the socket's
MAXMSGSIZE) before the check. The ipc:// socket sits in an owner-only
directory and tcp:// binds loopback unless ``--host`` says otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
import time

SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
MAC_BYTES = 32
KEY_SUFFIX = ".key"
REQUEST_LABEL = b"tprun engine request\n"
REPLY_LABEL = b"tprun engine reply\n"


class AuthError(ValueError):
    """A message without a valid MAC; the text says what was wrong with it."""


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def sibling_key_file(path: str) -> str:
    """Where the key of an endpoint file or an ipc socket at ``path`` lives."""
    return path + KEY_SUFFIX


def write_key_file(path: str, secret: bytes) -> None:
    """Write ``secret`` (hex, one line) to ``path`` atomically; the file is
    created mode 0600, so no other user can read it at any moment."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp: O_EXCL, mode 0600
            f.write(secret.hex() + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_key_file(path: str) -> bytes:
    """The secret in ``path``. Raises ``ValueError`` if the file is missing,
    readable by others than its owner, or does not hold a hex secret."""
    try:
        with open(path, encoding="ascii") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read().strip()
    except FileNotFoundError:
        raise ValueError(f"no key file at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the key file {path}: {e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"the key file {path} is open to other users "
                         f"(mode {stat.S_IMODE(mode):o}); it must be 0600")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"the key file {path} does not hold a hex secret") from None
    return check_secret(secret)


def check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes):
        raise ValueError(f"a secret is bytes, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"a secret of {len(secret)} bytes is too short "
                         f"(at least {MIN_SECRET_BYTES})")
    return secret


class Authenticator:
    """Seals outgoing payloads and unseals incoming frames for one side.

    ``for_server``: unseals requests, seals replies; ``for_client`` the
    reverse. Both sides must hold the same secret.
    """

    def __init__(self, secret: bytes, send_label: bytes, receive_label: bytes):
        self._secret = check_secret(secret)
        self._send_label = send_label
        self._receive_label = receive_label

    @classmethod
    def for_server(cls, secret: bytes) -> Authenticator:
        return cls(secret, REPLY_LABEL, REQUEST_LABEL)

    @classmethod
    def for_client(cls, secret: bytes) -> Authenticator:
        return cls(secret, REQUEST_LABEL, REPLY_LABEL)

    def _mac(self, label: bytes, payload: bytes) -> bytes:
        digest = hmac.new(self._secret, label, hashlib.sha256)
        digest.update(payload)
        return digest.digest()

    def seal(self, payload: bytes) -> list[bytes]:
        """The frames to send: ``[mac, payload]``."""
        return [self._mac(self._send_label, payload), payload]

    def unseal(self, frames: list[bytes]) -> bytes:
        """The payload of ``[mac, payload]``; ``AuthError`` unless the MAC is right."""
        if len(frames) != 2:
            raise AuthError(f"expected 2 frames [mac, payload], got {len(frames)}")
        mac, payload = frames
        if len(mac) != MAC_BYTES:
            raise AuthError(f"a MAC is {MAC_BYTES} bytes, got {len(mac)}")
        if not hmac.compare_digest(mac, self._mac(self._receive_label, payload)):
            raise AuthError("wrong MAC")
        return payload


class RefusalLog:
    """Counts refused messages and logs them, at most ``per_second`` lines
    a second: a flood cannot flood the log. The first line logged after a
    quiet spell says how many refusals went unlogged before it, so the
    lines (1 each, plus those counts) always add up to ``count`` once a
    line has been logged after the last refusal."""

    def __init__(self, logger: logging.Logger, what: str, per_second: int = 10,
                 clock=time.monotonic):
        self.logger = logger
        self.what = what
        self.per_second = per_second
        self.clock = clock
        self.count = 0
        self.unlogged = 0
        self._window_start = float("-inf")
        self._logged_in_window = 0

    def refuse(self, reason: str) -> None:
        self.count += 1
        now = self.clock()
        if now - self._window_start >= 1.0:
            self._window_start, self._logged_in_window = now, 0
        if self._logged_in_window >= self.per_second:
            self.unlogged += 1
            return
        self._logged_in_window += 1
        skipped = f"; {self.unlogged} earlier refusals unlogged" if self.unlogged else ""
        self.logger.warning("refused %s (dropped unread): %s%s", self.what, reason, skipped)
        self.unlogged = 0
