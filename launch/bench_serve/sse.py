"""The ``data:`` fields of a server-sent event stream, from the bytes of
each network read as they come.

A read may end anywhere: inside a UTF-8 character, a line or a JSON
object, or after several events. ``DataLines.feed`` keeps what follows
the last line ending for the next read and returns the data of every
line completed so far; lines end with ``\\n``, ``\\r\\n`` or ``\\r`` (the
SSE grammar). Comment lines (``:``, pings), field lines other than
``data`` and the blank lines between events give nothing; ``[DONE]`` is
returned like any data. ``close`` returns the data of a last line that
no line ending followed.
"""

from __future__ import annotations

import codecs
import re

_LINE_END = re.compile(r"\r\n|\r|\n")


class DataLines:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._pending = ""

    def feed(self, read: bytes) -> list[str]:
        """The data of each line the bytes ``read`` complete, in order."""
        *lines, self._pending = _LINE_END.split(self._pending + self._decoder.decode(read))
        return [data for line in lines if (data := _data(line)) is not None]

    def close(self) -> list[str]:
        """The data of the line left without a line ending, if any."""
        line, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        data = _data(line)
        return [] if data is None else [data]


def _data(line: str) -> str | None:
    """The value of a ``data`` field line (one leading space dropped, as
    the SSE grammar says); None for any other line."""
    if not line.startswith("data:"):
        return None
    value = line[len("data:"):]
    return value[1:] if value.startswith(" ") else value
