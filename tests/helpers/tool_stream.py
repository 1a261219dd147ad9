"""A chat stream's ``delta.tool_calls`` entries put back together, as a
client does, with the rules of their shape checked on the way: a call's
first entry carries its index, id, type "function", name and a piece of
arguments (maybe ""); each later entry of the call carries its index and
one more piece of arguments, nothing else; calls come one after another
(index 0, 1, ...), none going on once the next has started. And the texts
the readers' tests feed in pieces: every way ``splits`` cuts a text, and
``scanned`` for the readers that rescan the text so far; ``SearchCount``
measures how much of the text the readers search."""

from __future__ import annotations

import re
import sys

from serving.http.streamed_text import StreamedText


def assembled(entries: list[dict]) -> list[dict]:
    """The message's ``tool_calls`` that ``entries`` add up to."""
    calls: list[dict] = []
    for entry in entries:
        function = entry["function"]
        if "id" in entry:
            assert entry["index"] == len(calls), entry
            assert entry["type"] == "function" and set(entry) == {"index", "id", "type",
                                                                  "function"}, entry
            assert set(function) == {"name", "arguments"}, entry
            calls.append({"id": entry["id"], "type": "function",
                          "function": {"name": function["name"],
                                       "arguments": function["arguments"]}})
            continue
        assert set(entry) == {"index", "function"} and set(function) == {"arguments"}, entry
        assert calls and entry["index"] == len(calls) - 1, entry
        assert function["arguments"], entry  # no empty pieces after the first entry
        calls[-1]["function"]["arguments"] += function["arguments"]
    return calls


def argument_pieces(entries: list[dict], index: int) -> list[str]:
    """The non-empty pieces of arguments that call ``index`` came in."""
    return [piece for e in entries if e["index"] == index
            for piece in [e["function"]["arguments"]] if piece]


def pieces_of(text: str, size: int) -> list[str]:
    """``text`` cut every ``size`` characters ([""] for an empty text)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def splits(text: str) -> list[list[str]]:
    """The text in pieces of every size, and in two at every character."""
    return ([pieces_of(text, size) for size in range(1, max(len(text), 1) + 1)]
            + [[text[:i], text[i:]] for i in range(1, len(text))])


def scanned(reader, pieces: list[str]):
    """``reader`` (``scan(text_so_far, last)``, its output so far ``out``)
    fed the pieces' growing text (a ``StreamedText``, which lets go of what
    the reader no longer needs: ``needed_from``); what it has written must
    stay written."""
    so_far = StreamedText()
    for i, piece in enumerate(pieces):
        so_far.add(piece)
        before = reader.out
        reader.scan(so_far, last=i == len(pieces) - 1)
        so_far.release(reader.needed_from())
        assert reader.out.startswith(before)  # what is written stays
    return reader


class SearchCount:
    """How many characters a reader's searches go over while it reads, the
    readers' own measure of their work: each regular expression of
    ``modules`` (``monkeypatch`` swaps in a counting stand-in) adds the
    span it matched (a search that finds nothing: all it searched), and
    the reader's text, made with ``text`` (``CountedText``), adds what
    each ``find`` went over; ``copied`` counts what that text copies."""

    def __init__(self, monkeypatch, modules) -> None:
        self.chars = 0
        self.copied = 0
        for module in modules:
            for name, value in vars(module).items():
                if isinstance(value, re.Pattern):
                    monkeypatch.setattr(module, name, _CountedPattern(value, self))

    def text(self) -> CountedText:
        return CountedText(self)


class _CountedPattern:
    def __init__(self, pattern: re.Pattern, count: SearchCount) -> None:
        self.pattern, self.count = pattern, count

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize):
        return self._spanned(self.pattern.match(string, pos, endpos), pos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize):
        return self._spanned(self.pattern.fullmatch(string, pos, endpos), pos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize):
        found = self.pattern.search(string, pos, endpos)
        self.count.chars += (found.end() if found else min(len(string), endpos)) - pos
        return found

    def _spanned(self, found, pos: int):
        if found:
            self.count.chars += found.end() - pos
        return found


class CountedText(StreamedText):
    """A reader's text that counts into ``count`` what its searches go
    over (``chars``: what each ``find`` searched) and the characters it
    copies (``copied``: each string it joins, the window's included), so
    the work a piece costs is measured by what is done, on any Python."""

    def __init__(self, count) -> None:
        self.count = count
        super().__init__()

    def find(self, sub: str, start: int) -> int:
        found = super().find(sub, start)
        self.count.chars += (found + len(sub) if found >= 0 else len(self)) - start
        return found

    def _joined(self, parts: list[str]) -> str:
        joined = super()._joined(parts)
        self.count.copied += len(joined)
        return joined
