"""Reading structural tags back out of an output, with ``json`` and
``jsonschema`` (independent of the grammar that wrote them)."""

from __future__ import annotations

import json

import jsonschema


def read_tags(text: str, tag: dict, cut: bool) -> list[tuple[str, object]]:
    """The (begin, JSON value) of each tag in ``text``, asserting the
    structure: outside the tags no trigger; at each trigger one structure's
    begin, a JSON value valid against its schema (``jsonschema``) and its
    end, nothing between them.
    ``cut``: the output ended at max_tokens, so its last tag may be
    unfinished (it must then run to the end of the text)."""
    decoder = json.JSONDecoder()
    found, pos = [], 0
    while True:
        starts = [(text.find(t, pos), t) for t in tag["triggers"] if text.find(t, pos) >= 0]
        if not starts:
            return found
        at = min(starts)[0]
        try:
            structure = next(s for s in tag["structures"] if text.startswith(s["begin"], at))
            value, stop = decoder.raw_decode(text, at + len(structure["begin"]))
            assert text.startswith(structure["end"], stop), text[at:]
        except (StopIteration, json.JSONDecodeError, AssertionError):
            assert cut and _unfinished(text[at:], tag), f"bad tag at {at}: {text[at:]!r}"
            return found
        jsonschema.validate(value, structure["schema"])
        found.append((structure["begin"], value))
        pos = stop + len(structure["end"])


def _unfinished(rest: str, tag: dict) -> bool:
    """``rest`` is the start of a tag: a prefix of a begin, or a begin and
    the start of a JSON value (no end written)."""
    return any(s["begin"].startswith(rest) or
               (rest.startswith(s["begin"]) and s["end"] not in rest[len(s["begin"]):])
               for s in tag["structures"])
