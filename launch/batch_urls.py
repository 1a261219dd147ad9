"""``run-batch``'s files at http(s) URLs, as vLLM's ``vllm run-batch``
takes them: the input read with one GET, the output sent with one PUT of
the whole file (a presigned object-store URL, say). aiohttp, as vLLM.

A name is a URL when it starts with a scheme and ``://``; only ``http``
and ``https`` are read or written, and ``url_error`` refuses any other
(``s3://``, ``file://``) before anything starts. (vLLM takes a name for a
URL when it starts with ``http://`` or ``https://``, any other for a
path.)

The GET's body is copied whole (``download``), bytes as they come, before
the engine starts, so a URL that cannot be read is the user's error
before any process starts, and the run then reads a local copy as it
reads a file (the lines' bytes are ``batch_lines``' to judge). A status
other than 2xx after redirects, a connection that fails, or a server
silent for ``READ_TIMEOUT_S`` is a ``TransferError``.

The PUT (``upload``) sends the file with its ``Content-Length`` and
``Content-Type: application/octet-stream``, as vLLM's aiohttp call does;
it is tried up to ``UPLOAD_ATTEMPTS`` times, ``UPLOAD_RETRY_S`` apart, each
try given ``UPLOAD_TIMEOUT_S`` (vLLM's 5 tries, 5 s and 1000 s), while it
fails to connect, times out or is answered 408, 429 or 5xx; any other
answer but 2xx ends it at once (a presigned URL refused, 403, stays
refused; vLLM tries every failure again and takes only 200, where a
plain or WebDAV server answers 201 or 204).

Messages name a URL without its query and user info (``shown``): a
presigned URL's query is its credential.
"""

from __future__ import annotations

import asyncio
import re
import sys
from http import HTTPStatus
from typing import BinaryIO
from urllib.parse import urlsplit

import aiohttp

SCHEMES = ("http", "https")

UPLOAD_ATTEMPTS = 5
UPLOAD_RETRY_S = 5.0
UPLOAD_TIMEOUT_S = 1000.0
# A GET whose server sends nothing for this long fails; a long body that
# keeps coming does not.
CONNECT_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 300.0

_CHUNK = 1 << 16
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Answers a later try may not get: the server's trouble, not the request's.
_TRY_AGAIN = {HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.TOO_MANY_REQUESTS}


class TransferError(Exception):
    """A GET or PUT that failed; the message says how (the URL not in it)."""


def is_url(name: str) -> bool:
    """Whether ``name`` (a command line's file) is a URL: ``scheme://...``."""
    return _SCHEME.match(name) is not None


def url_error(url: str) -> str | None:
    """Why ``url`` cannot be read or written (a scheme other than http and
    https, a port that is not one, no host); None when it can be tried."""
    scheme = _SCHEME.match(url).group(1).lower()
    if scheme not in SCHEMES:
        return f"{scheme}:// is not read or written: only http:// and https:// URLs are"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # ``port`` checks the port
    except ValueError as e:  # a port that is not a number or out of range, a bad IPv6 address
        return f"not a URL ({e})"
    if not host:
        return "no host"
    return None


def shown(url: str) -> str:
    """``url`` for a message: without its user info and query (a presigned
    URL's signature), its fragment dropped."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" + ("?..." if parts.query else "")


def download(url: str, sink: BinaryIO) -> None:
    """The body of a GET of ``url`` written to ``sink``; ``TransferError``
    else."""
    asyncio.run(_download(url, sink))


async def _download(url: str, sink: BinaryIO) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                    sock_read=READ_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, \
                session.get(url) as answer:
            if not 200 <= answer.status < 300:
                raise TransferError(f"HTTP {answer.status} {answer.reason or ''}".rstrip())
            async for chunk in answer.content.iter_chunked(_CHUNK):
                sink.write(chunk)
    except asyncio.TimeoutError:
        raise TransferError(f"no answer within {READ_TIMEOUT_S:.0f} s") from None
    except aiohttp.ClientError as e:
        raise TransferError(_client_error(e)) from None


def upload(url: str, path: str, attempts: int = UPLOAD_ATTEMPTS,
           retry_s: float = UPLOAD_RETRY_S) -> None:
    """The file ``path`` sent whole with a PUT to ``url``, tried again (a
    line on stderr each time) while the failure may pass; the last
    failure's ``TransferError`` else."""
    asyncio.run(_upload(url, path, attempts, retry_s))


async def _upload(url: str, path: str, attempts: int, retry_s: float) -> None:
    for attempt in range(1, attempts + 1):
        try:
            return await _put(url, path)
        except _Retry as e:
            if attempt == attempts:
                raise TransferError(f"{e} ({attempts} tries)") from None
            print(f"tprun run-batch: the upload to {shown(url)} failed ({e}), try {attempt} "
                  f"of {attempts}; again in {retry_s:g} s", file=sys.stderr, flush=True)
            await asyncio.sleep(retry_s)


class _Retry(TransferError):
    """A failure a later try may not meet."""


async def _put(url: str, path: str) -> None:
    timeout = aiohttp.ClientTimeout(total=UPLOAD_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with open(path, "rb") as body:
                async with session.put(url, data=body, headers={
                        "Content-Type": "application/octet-stream"}) as answer:
                    if 200 <= answer.status < 300:
                        return
                    failure = f"HTTP {answer.status} {answer.reason or ''}".rstrip()
                    if answer.status >= 500 or answer.status in _TRY_AGAIN:
                        raise _Retry(failure)
                    raise TransferError(failure)
    except asyncio.TimeoutError:
        raise _Retry(f"no answer within {UPLOAD_TIMEOUT_S:.0f} s") from None
    except aiohttp.ClientConnectionError as e:
        raise _Retry(_client_error(e)) from None
    except aiohttp.ClientError as e:  # a bad URL or redirect: the same again
        raise TransferError(_client_error(e)) from None


def _client_error(e: aiohttp.ClientError) -> str:
    """aiohttp's failure in words, without the URL (``InvalidURL`` and
    redirect errors carry it whole; a connection's names only the host)."""
    if isinstance(e, aiohttp.ClientConnectorError):  # "Cannot connect to host H:P ..."
        return str(e)
    if isinstance(e, aiohttp.TooManyRedirects):
        return "too many redirects"
    if isinstance(e, aiohttp.InvalidURL):
        return "not a URL aiohttp can request"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
