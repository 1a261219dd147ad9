"""The engine's grammar side on ``tiny``'s byte-level vocabulary (id b is byte
b, EOS 257, ids 259..319 padding), where every mask can be worked out by
hand: the tokens a regex allows step by step, EOS only where the grammar may
end, rollback, the rows of requests that are gone, the compile cache and its
time limit."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from checkpoint.tiny_model import EOS
from engine.structured_outputs import StructuredOutputManager, StructuredOutputsParams
from engine.structured_outputs.backend import GrammarError, GuidanceBackend
from engine.structured_outputs.compiler import GrammarCompiler
from engine.structured_outputs.params import GrammarKey, StructuredOutputsError, closed_objects
from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH, nesting_depth
from ipc.messages import SchedulerOutput

VOCAB = 320


@pytest.fixture(scope="module")
def manager(tiny_dir):
    m = StructuredOutputManager(f"{tiny_dir}/tokenizer.json", VOCAB, [EOS], timeout_s=30)
    yield m
    m.shutdown()


class _Req:
    def __init__(self, grammar):
        self.grammar = grammar


def allowed(manager, requests: dict, req_ids: list[str]) -> list[list[int]]:
    plan = SchedulerOutput(step_id=3, structured_output_req_ids=req_ids)
    bitmask = manager.bitmask(plan, requests)
    assert bitmask.step_id == 3 and bitmask.req_ids == req_ids
    words = np.frombuffer(bitmask.bitmask, dtype="<i4").reshape(len(req_ids), (VOCAB + 31) // 32)
    bits = (words[:, :, None].astype(np.int64) >> np.arange(32)) & 1
    return [np.flatnonzero(row.reshape(-1)[:VOCAB]).tolist() for row in bits]


def grammar_for(manager, **constraint):
    from engine import SamplingParams

    params = SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
    manager.check(params)
    return manager.new_grammar(params)


def test_regex_masks_step_by_step_and_eos_only_at_the_end(manager):
    g = grammar_for(manager, regex="a[bc]d?")
    reqs = {"r": _Req(g)}
    assert allowed(manager, reqs, ["r"]) == [[ord("a")]]
    assert g.accept(ord("a")) and not g.is_terminated()
    assert allowed(manager, reqs, ["r"]) == [[ord("b"), ord("c")]]
    assert g.accept(ord("c"))
    # "ac" may end here or go on with "d": EOS and d, nothing else.
    assert allowed(manager, reqs, ["r"]) == [[ord("d"), EOS]]
    assert g.accept(ord("d")) and g.is_terminated()
    g.rollback_to(1)  # back to "a"
    assert g.num_tokens == 1 and not g.is_terminated()
    assert allowed(manager, reqs, ["r"]) == [[ord("b"), ord("c")]]
    assert not g.accept(ord("z")) and g.is_error()
    # Why, on one line (llguidance's parser state and grammar left out).
    assert '"z"' in g.error() and "\n" not in g.error() and "<grammar>" not in g.error()


def test_choice_and_rows_of_requests_that_are_gone(manager):
    g = grammar_for(manager, choice=["yes", "no"])
    reqs = {"a": _Req(g), "plain": _Req(None)}
    rows = allowed(manager, reqs, ["gone", "a", "plain"])
    assert rows[0] == rows[2] == list(range(VOCAB))  # discarded anyway: everything allowed
    assert rows[1] == [ord("n"), ord("y")]


def test_each_request_gets_its_own_matcher_from_one_compile(manager):
    first = grammar_for(manager, choice=["ab", "ac"])
    second = grammar_for(manager, choice=["ab", "ac"])
    assert first.matcher is not second.matcher
    assert first.accept(ord("a"))
    assert allowed(manager, {"1": _Req(first), "2": _Req(second)}, ["1", "2"]) == [
        [ord("b"), ord("c")], [ord("a")]]


def test_json_schema_compact_has_no_whitespace(manager):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    g = grammar_for(manager, json=schema, disable_any_whitespace=True)
    reqs = {"r": _Req(g)}
    for ch in '{"n":':
        assert allowed(manager, reqs, ["r"]) == [[ord(ch)]]
        assert g.accept(ord(ch))
    assert allowed(manager, reqs, ["r"])[0] == [ord("-")] + list(range(ord("0"), ord("9") + 1))


def test_json_objects_are_closed_unless_the_schema_opens_them(manager):
    """After '{"n":5' a schema naming only n allows more digits and the
    closing brace, not a comma for another key; one that says
    ``additionalProperties: true`` allows the comma too."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    digits = list(range(ord("0"), ord("9") + 1))
    for extra, after in ((None, sorted([ord("}")] + digits)),
                         (True, sorted([ord(","), ord("}")] + digits))):
        g = grammar_for(manager, disable_any_whitespace=True,
                        json=schema if extra is None else {**schema, "additionalProperties": extra})
        for ch in '{"n":5':
            assert g.accept(ord(ch))
        assert allowed(manager, {"r": _Req(g)}, ["r"]) == [after]


def test_an_object_requiring_a_key_its_properties_do_not_name_stays_open(manager):
    """``required: ["id"]`` with only ``tag`` among the properties: "id" can
    only come as an additional property, so the object is not closed.
    ``jsonschema`` accepts '{"id":7}' and refuses '{"tag":1}'; so does the
    grammar, byte by byte, EOS last."""
    import jsonschema

    schema = {"type": "object", "properties": {"tag": {"type": "integer"}}, "required": ["id"]}
    for text, valid in (('{"id":7}', True), ('{"tag":1,"id":"x"}', True), ('{"tag":1}', False)):
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) == valid
        g = grammar_for(manager, json=schema, disable_any_whitespace=True)
        assert all(g.accept(b) for b in [*text.encode(), EOS]) == valid, text


@pytest.mark.parametrize("schema", [True, "true"])
def test_the_schema_true_allows_any_json_value(manager, schema):
    """``true`` is the schema every value satisfies (as ``{}``): a number, a
    string and an object each go through, EOS last."""
    for text in ("5", '"x"', '{"a":[null]}'):
        g = grammar_for(manager, json=schema, disable_any_whitespace=True)
        assert all(g.accept(b) for b in [*text.encode(), EOS]), text


def test_the_schema_false_is_refused_naming_the_key():
    with pytest.raises(StructuredOutputsError, match="structured_outputs.json is the schema "
                                                     "false, which no value satisfies"):
        StructuredOutputsParams(json="false")


@pytest.mark.parametrize("grammar", [
    '?start: pair\n?pair: "(" NAME ")"\nNAME: /[a-z]+/',  # Lark, inlined rules
    '!start: "(" NAME ")"\nNAME: /[a-z]+/',  # Lark, kept tokens
    'start: "(" NAME ")"\nNAME: /[a-z]+/',
    'root ::= "(" name ")"\nname ::= [a-z]+',  # GBNF
    '# a pair\nroot   ::= "(" name ")"\n\nname ::= [a-z] [a-z]*',
])
def test_lark_and_gbnf_grammars_hold_the_output(manager, grammar):
    """Each grammar is the language of a parenthesised lower-case word,
    in Lark (whatever its start rule's prefix) or in GBNF: "(ab)" then EOS
    goes through, and "ab" or "()" is refused."""
    g = grammar_for(manager, grammar=grammar)
    assert all(g.accept(b) for b in [*b"(ab)", EOS])
    for text in (b"ab", b"()"):
        g = grammar_for(manager, grammar=grammar)
        assert not all(g.accept(b) for b in text), text


LONE = "a\\"  # the regex a\ : its backslash escapes nothing


@pytest.mark.parametrize("schema, regex, where", [
    ({"type": "object", "properties": {"box": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": LONE}}}}},
     LONE, "#/properties/box/properties/code/pattern"),
    ({"type": "object", "properties": {"c": {"$ref": "#/$defs/code"}},
      "$defs": {"code": {"type": "string", "pattern": "[0-9]+\\"}}},
     "[0-9]+\\", "#/$defs/code/pattern"),
    ({"type": "array", "items": {"type": "string", "pattern": LONE}}, LONE, "#/items/pattern"),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"pattern": "\\"}]},
     "\\", "#/prefixItems/1/pattern"),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "pattern": LONE}]},
     LONE, "#/anyOf/1/pattern"),
    ({"type": "object", "patternProperties": {"^x/y\\": {"type": "integer"}}},
     "^x/y\\", "#/patternProperties/^x~1y\\"),
    ({"type": "string", "pattern": "a\\\\\\"}, "a\\\\\\", "#/pattern"),  # a\\ then a lone \
])
def test_a_schema_regex_ending_in_a_lone_backslash_is_refused(schema, regex, where):
    """llguidance drops such a backslash (``a\\`` matches as ``a``) in a
    schema's regexes as in a regex constraint: refused, naming the regex
    (as JSON writes it) and its place, before any tokenizer is built."""
    backend = GuidanceBackend("/nonexistent/tokenizer.json", vocab_size=8, eos_token_ids=[0])
    with pytest.raises(GrammarError) as info:
        backend.compile(StructuredOutputsParams(json=schema).key)
    assert str(info.value) == (f"invalid JSON schema: the pattern {json.dumps(regex)} at "
                               f"{where} ends in an incomplete escape (a lone backslash)")
    assert backend._tokenizer is None


def test_a_schema_regex_ending_in_an_escaped_backslash_is_kept(manager):
    """``^a\\\\$`` (a then one backslash): after '"a' only the backslash may
    come, written as JSON writes it (two of them), then the closing quote;
    data ending in a backslash (``const``, ``enum``) and a property named
    "pattern" are no regexes and compile."""
    g = grammar_for(manager, json={"type": "string", "pattern": "^a\\\\$"},
                    disable_any_whitespace=True)
    reqs = {"r": _Req(g)}
    for ch in '"a\\\\':
        assert g.accept(ord(ch)), ch
    assert allowed(manager, reqs, ["r"]) == [[ord('"')]]
    assert g.accept(ord('"')) and g.is_terminated()
    g = grammar_for(manager, json={"type": "string", "pattern": "^a\\\\$"},
                    disable_any_whitespace=True)
    assert g.accept(ord('"')) and g.accept(ord("a"))
    assert allowed(manager, {"r": _Req(g)}, ["r"]) == [[ord("\\")]]
    data = {"type": "object", "properties": {
        "pattern": {"const": "x\\"}, "kind": {"enum": ["\\", {"pattern": "\\"}]}}}
    assert grammar_for(manager, json=data) is not None


@pytest.mark.parametrize("shape", ["arrays", "objects"])
def test_max_schema_depth_is_the_deepest_llguidance_compiles(manager, shape):
    """Why the limit is what it is: the backend itself (reached with a
    ``GrammarKey``, past ``StructuredOutputsParams``' check) compiles a
    schema nested ``MAX_SCHEMA_DEPTH`` deep and refuses one level more with
    its JSON reader's recursion limit. Should llguidance change its limit,
    this fails, and the constant follows it."""

    def nested(levels: int) -> dict:
        schema: dict = {"type": "integer"}
        while nesting_depth(schema) < levels:
            schema = ({"type": "array", "items": schema} if shape == "arrays" or
                      nesting_depth(schema) == levels - 1
                      else {"type": "object", "properties": {"a": schema}})
        return schema

    def key(levels: int) -> GrammarKey:
        schema = nested(levels)
        assert nesting_depth(schema) == levels
        return GrammarKey("json", json.dumps(schema, separators=(",", ":")))

    manager.backend.compile(key(MAX_SCHEMA_DEPTH))
    with pytest.raises(GrammarError, match="recursion limit exceeded"):
        manager.backend.compile(key(MAX_SCHEMA_DEPTH + 1))
    with pytest.raises(StructuredOutputsError, match="more than 124 levels deep"):
        StructuredOutputsParams(json=nested(MAX_SCHEMA_DEPTH + 1))


def test_closed_objects_closes_object_schemas_not_data_or_compositions():
    """Worked by hand: nested, ``$defs`` and union-member objects are closed;
    a property named "properties", enum data, an explicit
    ``additionalProperties``, ``not`` and ``if``, the members of ``allOf``,
    members that add keys to an object naming its own (``anyOf``, ``then``)
    and that object itself, and one beside a ``$ref``, are left."""
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "tag": {"enum": [{"properties": {"x": 1}}]},
            "open": {"type": "object", "properties": {"b": {}}, "additionalProperties": True},
            "list": {"type": "array", "items": {"properties": {"c": {}}}},
            "either": {"anyOf": [{"properties": {"d": {}}}, {"type": "null"}]},
            "both": {"allOf": [{"properties": {"e": {}}}, {"properties": {"f": {}}}]},
            "ref": {"$ref": "#/$defs/T", "properties": {"g": {}}},
            "extended": {"properties": {"i": {}}, "anyOf": [{"properties": {"j": {}}}],
                         "if": {"properties": {"i": {"const": 1}}},
                         "then": {"properties": {"k": {}}}},
            "neither": {"not": {"properties": {"m": {}}, "required": ["m"]}},
        },
        "$defs": {"T": {"properties": {"h": {}}}},
    }
    closed = {"additionalProperties": False}
    assert closed_objects(schema) == {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "integer"}}, **closed},
            "tag": {"enum": [{"properties": {"x": 1}}]},
            "open": {"type": "object", "properties": {"b": {}}, "additionalProperties": True},
            "list": {"type": "array", "items": {"properties": {"c": {}}, **closed}},
            "either": {"anyOf": [{"properties": {"d": {}}, **closed}, {"type": "null"}]},
            "both": {"allOf": [{"properties": {"e": {}}}, {"properties": {"f": {}}}]},
            "ref": {"$ref": "#/$defs/T", "properties": {"g": {}}},
            "extended": schema["properties"]["extended"],
            "neither": {"not": {"properties": {"m": {}}, "required": ["m"]}},
        },
        "$defs": {"T": {"properties": {"h": {}}, **closed}},
        **closed,
    }
    assert schema["properties"]["list"]["items"] == {"properties": {"c": {}}}  # a copy


class _SlowBackend:
    """A backend whose compiles of the text "slow" take ``delay`` seconds,
    the others none; the text "bad" fails."""

    def __init__(self, delay: float):
        self.delay = delay
        self.calls = 0
        self.lock = threading.Lock()

    def compile(self, key: GrammarKey):
        with self.lock:
            self.calls += 1
        time.sleep(self.delay if key.text == "slow" else 0.0)
        if key.text == "bad":
            raise GrammarError("invalid regex: bad")
        return ("compiled", key)


def test_compiler_caches_by_text_and_limits_time():
    backend = _SlowBackend(delay=0.5)
    compiler = GrammarCompiler(backend, timeout_s=0.2)
    try:
        slow = GrammarKey("regex", "slow")
        start = time.monotonic()
        compiler.submit(slow)
        assert time.monotonic() - start < 0.1  # submitting never waits
        assert not compiler.ready(slow)
        with pytest.raises(GrammarError, match="did not compile within 0.2 s"):
            compiler.result(slow)
        assert time.monotonic() - start < 0.45  # gave up at the limit, not at the end
        assert compiler.ready(slow)  # its deadline passed: answers at once
        time.sleep(0.5)
        assert compiler.result(slow) == ("compiled", slow)  # finished later: cached
        bad = GrammarKey("regex", "bad")
        compiler.timeout_s = 5.0
        for _ in range(2):
            with pytest.raises(GrammarError, match="invalid regex: bad"):
                compiler.result(bad)
        assert backend.calls == 2  # one compile per text, failures cached too
    finally:
        compiler.shutdown()


def test_a_slow_compile_does_not_hold_up_a_fast_one():
    backend = _SlowBackend(delay=1.0)
    compiler = GrammarCompiler(backend, timeout_s=5.0, max_workers=2)
    try:
        compiler.submit(GrammarKey("regex", "slow"))
        start = time.monotonic()
        assert compiler.result(GrammarKey("regex", "fast"))[0] == "compiled"
        assert time.monotonic() - start < 0.5
    finally:
        compiler.shutdown()
