"""Structural tags: free text in which each trigger opens a tagged JSON value.

vLLM's ``structural_tag`` constraint (a JSON text, the form its llguidance
backend reads): ``{"structures": [{"begin", "schema", "end"}, ...],
"triggers": [...]}``, any other key (``"type": "structural_tag"``, which the
HTTP ``response_format`` carries) ignored. The output is free text until it
writes a trigger; from there it must write the rest of the ``begin`` of a
structure whose ``begin`` starts with that trigger, then one JSON value valid
against that structure's ``schema``, then its ``end`` (nothing, not even
whitespace, between the three), and is free text again. Each ``begin`` is
read with the first trigger it starts with, as vLLM reads it
(``read_with``); a trigger no ``begin`` is read with is plain text.

``canonical`` checks a tag's shape and gives its text with only the keys
read; a bad shape is a ``StructuredOutputsError`` whose key is the path of
the bad part (``structural_tag.structures[0].begin``). The compile key
closes each schema's objects, as a ``json`` constraint's
(``params.closed_objects``). xgrammar's newer form (``{"format": {...}}``)
is refused by name: llguidance does not read it.

``lark`` writes the grammar that llguidance's ``StructTag`` builder writes
(free text, then each structure's trigger, the rest of its begin, ``%json``
of its schema with ``disable_any_whitespace`` as its ``x-guidance`` option,
its end), but decides for each trigger on its own whether it is a token:
one that is exactly one special token of the model's tokenizer is matched
as that token (``<[id]>``, ``_special_id``), any other as text, a lazy
lexeme, so free text ends as soon as it completes the trigger and never
holds it. In an end, and in a begin after its trigger, each special token's
text is matched as that token and the text around it as text (``_terms``),
as the tokenizer writes them: llguidance, held to a special token's text,
allows that token alone there, and would refuse it as text. (The builder
decides a trigger by spelling, ``<...>``, for all triggers at once, and
writes every begin and end as text: a special token spelled otherwise,
beside a ``<...>`` trigger that is no special token, or in a begin or an
end, would be matched as text, which a special token never is, so the
model could not write it.) A special token's text written in ordinary
tokens is free text, and ends no structure.
As in vLLM, a structure whose text trigger holds another structure's text
trigger ending before its own end (``"<ab"`` read before ``"<a"``) is never
written: free text ends at the shorter one first.
"""

from __future__ import annotations

import json
from typing import Any

from engine.structured_outputs.errors import StructuredOutputsError
from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH, text_nesting_depth

KEY = "structural_tag"
# A schema sits three containers inside the tag's text (object, list, object):
# the text's depth bounds every schema's before anything parses it.
_SCHEMA_NESTING = 3


def canonical(value: Any) -> str:
    """The tag's text with ``structures`` (``begin``, ``schema``, ``end``)
    and ``triggers`` alone, from JSON text, its shape checked."""
    if not isinstance(value, str) or not value:
        raise StructuredOutputsError(KEY, "must be a non-empty string: the tag's JSON text")
    if text_nesting_depth(value) > MAX_SCHEMA_DEPTH + _SCHEMA_NESTING:
        raise StructuredOutputsError(
            KEY, f"nests objects and arrays more than {MAX_SCHEMA_DEPTH + _SCHEMA_NESTING} "
                 f"levels deep: a schema in it may nest at most {MAX_SCHEMA_DEPTH} (the deepest "
                 "the grammar backend reads)")
    try:
        tag = json.loads(value)
    except json.JSONDecodeError as e:
        raise StructuredOutputsError(KEY, f"is not valid JSON: {e}") from None
    if not isinstance(tag, dict):
        raise StructuredOutputsError(KEY, f"must be a JSON object, got {type(tag).__name__}")
    if "structures" not in tag and "format" in tag:
        raise StructuredOutputsError(f"{KEY}.format",
                                     "is xgrammar's structural tag form, which the llguidance "
                                     'backend does not read; give "structures" and "triggers"')
    triggers = _triggers(tag.get("triggers"))
    structures = tag.get("structures")
    where = f"{KEY}.structures"
    if not isinstance(structures, list) or not structures:
        raise StructuredOutputsError(
            where, 'must be a non-empty list of {"begin", "schema", "end"} objects')
    out = [_structure(s, f"{where}[{i}]") for i, s in enumerate(structures)]
    for i, trigger in enumerate(read_with([s["begin"] for s in out], triggers)):
        if trigger is None:
            raise StructuredOutputsError(f"{where}[{i}].begin",
                                         f"{json.dumps(out[i]['begin'])} starts with none of the "
                                         f"triggers {json.dumps(triggers)}")
    return json.dumps({"structures": out, "triggers": triggers}, separators=(",", ":"))


def read_with(begins: list[str], triggers: list[str]) -> list[str | None]:
    """The trigger each begin is read with: the first in ``triggers`` it
    starts with (None for none). The triggers go into a character trie
    whose nodes keep the first index of a trigger ending there, and each
    begin walks it: the work grows with the tag's text, never with begins
    times triggers (a tag of many of both would otherwise hold the thread
    that checks it for minutes)."""
    root: dict = {}
    for i, trigger in enumerate(triggers):
        node = root
        for char in trigger:
            node = node.setdefault(char, {})
        node.setdefault(_END, i)
    found = []
    for begin in begins:
        node, first = root, None
        for char in begin:
            node = node.get(char)
            if node is None:
                break
            if _END in node and (first is None or node[_END] < first):
                first = node[_END]
        found.append(None if first is None else triggers[first])
    return found


# The trie key of a node where a trigger ends (no character is None).
_END = None


def _triggers(triggers: Any) -> list[str]:
    where = f"{KEY}.triggers"
    if not isinstance(triggers, list) or not triggers:
        raise StructuredOutputsError(where, "must be a non-empty list of strings")
    for i, t in enumerate(triggers):
        if not isinstance(t, str) or not t:
            raise StructuredOutputsError(f"{where}[{i}]", "must be a non-empty string")
    return triggers


def _structure(s: Any, where: str) -> dict:
    if not isinstance(s, dict):
        raise StructuredOutputsError(where, 'must be an object with "begin", "schema" and "end"')
    for name in ("begin", "end"):
        if name not in s:
            raise StructuredOutputsError(f"{where}.{name}", "is missing")
        if not isinstance(s[name], str):
            raise StructuredOutputsError(f"{where}.{name}", "must be a string")
    schema = s.get("schema")
    if not isinstance(schema, dict):
        raise StructuredOutputsError(f"{where}.schema", "must be a JSON schema (an object), got "
                                                        f"{json.dumps(schema)[:80]}")
    try:  # NaN and Infinity parse, but are no JSON (as for a ``json`` constraint)
        json.dumps(schema, allow_nan=False)
    except ValueError as e:
        raise StructuredOutputsError(f"{where}.schema", f"cannot be written as JSON: {e}") from None
    return {"begin": s["begin"], "schema": schema, "end": s["end"]}


def closed(text: str, closed_objects) -> str:
    """A canonical tag's text with ``closed_objects`` applied to each schema."""
    tag = json.loads(text)
    for s in tag["structures"]:
        s["schema"] = closed_objects(s["schema"])
    return json.dumps(tag, separators=(",", ":"))


def schemas(text: str) -> list[tuple[str, dict]]:
    """Each structure's schema with its JSON pointer, from a tag's text."""
    tag = json.loads(text)
    return [(f"#/structures/{i}/schema", s["schema"]) for i, s in enumerate(tag["structures"])]


def lark(text: str, tokenizer: Any, compact: bool) -> str:
    """The llguidance grammar of a canonical tag over ``tokenizer`` (an
    ``LLTokenizer``); ``compact``: no whitespace between JSON tokens (a
    schema's own ``x-guidance`` options win, as for a ``json`` constraint)."""
    tag = json.loads(text)
    read = read_with([s["begin"] for s in tag["structures"]], tag["triggers"])
    specials = {t: _special_id(t, tokenizer) for t in set(read)}
    rules = []
    for i, (s, trigger) in enumerate(zip(tag["structures"], read)):
        own = s["schema"].get("x-guidance")
        options = {"whitespace_flexible": not compact, **(own if isinstance(own, dict) else {})}
        schema = json.dumps(dict(s["schema"], **{"x-guidance": options}))
        body = " ".join(part for part in (_terms(s["begin"][len(trigger):], tokenizer),
                                          f"%json {schema}", _terms(s["end"], tokenizer)) if part)
        if specials[trigger] is not None:
            rules.append(f"tag_{i}: TAG_TEXT <[{specials[trigger]}]> {body}")
            continue
        rules += [f"tag_{i}_trigger[lazy]: TAG_TEXT {_literal(trigger)}",
                  f"tag_{i}: tag_{i}_trigger {body}"]
    tags = " | ".join(f"tag_{i}" for i in range(len(tag["structures"])))
    return "\n".join(["%llguidance {}", f"start: ({tags})* tag_end", "tag_end: TAG_TEXT",
                      r"TAG_TEXT: /(.|\n)*/", *rules])


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _terms(text: str, tokenizer: Any) -> str:
    """``text`` in the grammar ("" for no text): each special token the
    tokenizer reads in it as that token (``<[id]>``), the text before,
    between and after them as literals."""
    ids = tokenizer.tokenize_str(text, parse_special=True) if text else []
    terms, at = [], 0
    for token in ids:
        if not tokenizer.is_special_token(token):
            continue
        spelled = tokenizer.decode_bytes([token]).decode("utf-8", errors="replace")
        found = text.find(spelled, at)
        if not spelled or found < 0:
            continue
        terms += [_literal(text[at:found]), f"<[{token}]>"]
        at = found + len(spelled)
    terms.append(_literal(text[at:]))
    return " ".join(term for term in terms if term)


def _special_id(text: str, tokenizer: Any) -> int | None:
    """The id of the special token ``text`` is exactly, or None (also for
    no text)."""
    ids = tokenizer.tokenize_str(text, parse_special=True)
    return ids[0] if len(ids) == 1 and tokenizer.is_special_token(ids[0]) else None
