"""A chat stream's ``delta.tool_calls`` entries put back together, as a
client does, with the rules of their shape checked on the way: a call's
first entry carries its index, id, type "function", name and a piece of
arguments (maybe ""); each later entry of the call carries its index and
one more piece of arguments, nothing else; calls come one after another
(index 0, 1, ...), none going on once the next has started."""

from __future__ import annotations


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
