"""Structured outputs on ``tiny`` (random weights): only the mask can make its
outputs valid. Every output of a JSON-schema request parses and validates
against the schema with ``jsonschema`` unless it was cut by ``max_tokens``
(``finish_reason == "length"``); a regex request's output matches it in
full; a choice request's output is one of the choices. Held at TP=1 and 2
(TP=3 on SmolLM2, whose heads divide by 3: test_structured_outputs_smollm2.py),
with async scheduling on and off, with prefix caching, under preemption,
with several requests of one constraint, and in mixed batches whose
unconstrained requests give the tokens they give alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.structured_outputs.schema_depth import MAX_SCHEMA_DEPTH
from ipc.errors import InvalidRequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "ok": {"type": "boolean"},
    },
    "required": ["id", "kind", "owner"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{2,5}-[0-9]{3}"
CHOICES = ["red", "green", "blue", "light blue"]
NUM_SEEDS = 50
MAX_TOKENS = 128
PROMPT = "Write a record:"

JSON_PARAMS = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)


def json_params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
                          structured_outputs=JSON_PARAMS)


def regex_params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=32,
                          structured_outputs=StructuredOutputsParams(regex=REGEX))


def choice_params(seed: int | None) -> SamplingParams:
    return SamplingParams(temperature=0.0 if seed is None else 1.0, seed=seed, max_tokens=16,
                          structured_outputs=StructuredOutputsParams(choice=CHOICES))


def nested_arrays(levels: int) -> dict:
    """A JSON schema of ``levels`` objects nested in one another: arrays of
    one item down to a digit, so its one answer is "[[...[d]...]]"."""
    schema: dict = {"type": "integer", "minimum": 0, "maximum": 9}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": 1}
    return schema


def assert_valid_json(outputs) -> int:
    """Each output validates (or was cut by max_tokens); returns how many finished."""
    finished = 0
    for out in outputs:
        completion = out.outputs[0]
        if completion.finish_reason == "length":
            assert len(completion.token_ids) == MAX_TOKENS
            continue
        assert completion.finish_reason == "stop", completion
        jsonschema.validate(json.loads(completion.text), SCHEMA)
        finished += 1
    return finished


def assert_regex(outputs) -> None:
    for out in outputs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop"
        assert re.fullmatch(REGEX, completion.text), completion.text


def assert_choice(outputs) -> None:
    for out in outputs:
        assert out.outputs[0].finish_reason == "stop"
        assert out.outputs[0].text in CHOICES


def mixed_batch():
    """Prompts and params: 50 JSON seeds, regexes, choices, and unconstrained
    requests (greedy and seeded) between them."""
    prompts, params = [], []
    for seed in range(NUM_SEEDS):
        prompts.append(PROMPT)
        params.append(json_params(seed))
        if seed % 10 == 0:
            prompts += ["Name and number:", "Pick a colour:", "Hello there", "Once upon"]
            params += [regex_params(seed), choice_params(seed),
                       SamplingParams(temperature=0.0, max_tokens=20),
                       SamplingParams(temperature=1.0, seed=seed, max_tokens=20)]
    return prompts, params


def check_mixed(outputs, params) -> None:
    kinds = [p.structured_outputs for p in params]
    json_outs = [o for o, k in zip(outputs, kinds) if k is JSON_PARAMS]
    assert len(json_outs) == NUM_SEEDS
    # Random weights under the mask: most records finish within MAX_TOKENS.
    assert assert_valid_json(json_outs) >= NUM_SEEDS // 2
    assert_regex([o for o, k in zip(outputs, kinds) if k is not None and k.regex])
    assert_choice([o for o, k in zip(outputs, kinds) if k is not None and k.choice])


@pytest.fixture(scope="module")
def unconstrained_alone(tiny_dir):
    """The unconstrained requests of ``mixed_batch``, each run alone."""
    prompts, params = mixed_batch()
    alone = {}
    with LLM(model=tiny_dir, device="cpu") as llm:
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            if p.structured_outputs is None:
                alone[i] = llm.generate(prompt, p)[0].outputs[0].token_ids
    return alone


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_mixed_batch_tp1(tiny_dir, unconstrained_alone, async_scheduling):
    prompts, params = mixed_batch()
    with LLM(model=tiny_dir, device="cpu", max_num_seqs=64,
             async_scheduling=async_scheduling) as llm:
        outputs = llm.generate(prompts, params)
    check_mixed(outputs, params)
    for i, tokens in unconstrained_alone.items():
        assert outputs[i].outputs[0].token_ids == tokens


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tp, async_scheduling", [(2, True), (2, False)])
def test_mixed_batch_tensor_parallel(tiny_dir, unconstrained_alone, tp, async_scheduling):
    prompts, params = mixed_batch()
    with LLM(model=tiny_dir, device="cpu", tensor_parallel_size=tp, max_num_seqs=64,
             async_scheduling=async_scheduling) as llm:
        outputs = llm.generate(prompts, params)
    check_mixed(outputs, params)
    for i, tokens in unconstrained_alone.items():
        assert outputs[i].outputs[0].token_ids == tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_mixed_batch_on_cuda(tiny_dir, async_scheduling):
    """The CUDA path: the mask copied on a side stream, the Triton kernel,
    decode steps replayed from CUDA graphs. (The unconstrained rows' tokens
    are compared with their runs alone on CPU, above: on a GPU the kernels
    of other batch sizes may round differently.)"""
    prompts, params = mixed_batch()
    with LLM(model=tiny_dir, device="cuda", max_num_seqs=64,
             async_scheduling=async_scheduling) as llm:
        outputs = llm.generate(prompts, params)
    check_mixed(outputs, params)


@pytest.mark.timeout(300)
def test_preemption_and_prefix_caching_keep_the_matchers_in_step(tiny_dir):
    """Seeded draws do not depend on the batch, so a request gives the same
    tokens when it is preempted (recomputed from prompt + kept outputs) and
    when its prompt's KV blocks come from the prefix cache: the matcher must
    follow exactly the tokens the request keeps, or the masks would differ."""
    seeds = range(12)
    prompts = [PROMPT + " a record of a pet and its owner, as JSON"] * len(seeds)
    params = [json_params(s) for s in seeds]
    with LLM(model=tiny_dir, device="cpu", max_num_seqs=4) as llm:
        roomy = llm.generate(prompts, params)
        cached = llm.generate(prompts, params)  # prompt blocks from the prefix cache
        assert llm.engine.scheduler.kv.prefix_hits > 0
    # 14 blocks of 16 tokens: four requests of up to 184 tokens cannot all grow.
    with LLM(model=tiny_dir, device="cpu", max_num_seqs=4, num_gpu_blocks_override=14,
             block_size=16, max_model_len=14 * 16) as llm:
        tight = llm.generate(prompts, params)
        assert llm.engine.scheduler.num_preemptions > 0
    assert assert_valid_json(roomy) >= len(seeds) // 2
    tokens = [o.outputs[0].token_ids for o in roomy]
    assert [o.outputs[0].token_ids for o in cached] == tokens
    assert [o.outputs[0].token_ids for o in tight] == tokens


@pytest.mark.timeout(300)
def test_requests_of_one_constraint_have_their_own_matchers(tiny_dir):
    """One StructuredOutputsParams (one compiled grammar) for several
    requests: equal seeds give equal outputs, so no request's tokens
    advanced another's matcher; greedy choice requests all give one choice."""
    params = [json_params(7), json_params(7), json_params(8), choice_params(None),
              choice_params(None)]
    with LLM(model=tiny_dir, device="cpu") as llm:
        outs = llm.generate([PROMPT] * len(params), params)
    tokens = [o.outputs[0].token_ids for o in outs]
    assert tokens[0] == tokens[1] and tokens[0] != tokens[2]
    assert outs[3].outputs[0].text == outs[4].outputs[0].text in CHOICES


@pytest.mark.timeout(300)
def test_json_object_and_grammar(tiny_dir):
    grammar = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(
                                 json_object=True, disable_any_whitespace=True))
              for s in range(8)]
    params += [SamplingParams(temperature=1.0, seed=s, max_tokens=40,
                              structured_outputs=StructuredOutputsParams(grammar=grammar))
               for s in range(8)]
    with LLM(model=tiny_dir, device="cpu") as llm:
        outs = llm.generate([PROMPT] * len(params), params)
    objects = [json.loads(o.outputs[0].text) for o in outs[:8]
               if o.outputs[0].finish_reason == "stop"]
    assert objects and all(isinstance(obj, dict) for obj in objects)
    tuples = [o.outputs[0].text for o in outs[8:] if o.outputs[0].finish_reason == "stop"]
    assert len(tuples) >= 4
    assert all(re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})*\)", t) for t in tuples), tuples


@pytest.mark.timeout(120)
@pytest.mark.parametrize("constraint, message", [
    ({"json": {"type": "object", "properties": {"a": {"type": "strnig"}}}},
     "invalid JSON schema"),
    ({"json": {"type": "string", "format": "not-a-format"}}, "Unknown format"),
    ({"regex": "[a-"}, "invalid regex.*unclosed character class"),
    ({"json": {"type": "object", "properties": {
        "ids": {"type": "array", "items": {"type": "string", "pattern": "[0-9]+\\"}}}}},
     re.escape('invalid JSON schema: the pattern "[0-9]+\\\\" at '
               '#/properties/ids/items/pattern ends in an incomplete escape')),
    ({"grammar": "start: missing_rule"}, "invalid grammar"),
    ({"structural_tag": json.dumps({"triggers": ["<t"], "structures": [
        {"begin": "<t>", "schema": {"type": "strnig"}, "end": "</t>"}]})},
     "invalid structural tag: .*strnig"),
    ({"structural_tag": json.dumps({"triggers": ["<t"], "structures": [
        {"begin": "<t>", "schema": {"pattern": "a\\"}, "end": "</t>"}]})},
     re.escape('invalid structural tag: the pattern "a\\\\" at #/structures/0/schema/pattern '
               "ends in an incomplete escape")),
    ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
    ({"regex": "a", "choice": ["a"]}, "exactly one of"),
    ({"choice": []}, "must not be empty"),
    ({"schema": {}}, "unknown structured_outputs field"),
    # Past Python's recursion limit, as an object and as text: refused for
    # its depth, before anything walks it.
    ({"json": nested_arrays(1000)}, "nests objects and arrays more than 124 levels deep"),
    ({"json": json.dumps(nested_arrays(900)).replace("}", "} ")},
     "nests objects and arrays more than 124 levels deep"),
    ({"json": '{"items":' * 5000 + "{}" + "}" * 5000}, "more than 124 levels deep"),
    ({"json": nested_arrays(125)}, "more than 124 levels deep"),  # one past the deepest
    ({"structural_tag": '{"triggers":["<"],"structures":[{"begin":"<","end":"","schema":'
                        + '{"items":' * 5000 + "{}" + "}" * 5000 + "}]}"},
     "structural_tag nests objects and arrays more than 127 levels deep: a schema in it may "
     "nest at most 124"),
    ({"structural_tag": json.dumps({"triggers": ["<"], "structures": [
        {"begin": "<", "end": "", "schema": nested_arrays(125)}]})},
     "structural_tag nests objects and arrays more than 127 levels deep"),
])
def test_bad_constraints_are_value_errors_and_the_engine_goes_on(tiny_dir, constraint, message):
    with LLM(model=tiny_dir, device="cpu") as llm:
        good = choice_params(None)
        with pytest.raises(ValueError, match=message):
            llm.generate(["a", "b"], [good, SamplingParams(structured_outputs=constraint)])
        assert not llm.engine.has_unfinished_requests()  # nothing of the good one was added
        assert llm.generate("a", good)[0].outputs[0].text in CHOICES


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_mask_that_leaves_the_grammar_no_token_ends_the_request_as_error(tiny_dir,
                                                                           async_scheduling):
    """``allowed_token_ids`` or ``bad_words`` that mask every token the
    grammar allows leave the sampler nothing (it takes token 0, byte NUL on
    ``tiny``'s byte tokenizer), which the grammar refuses: the request ends
    with vLLM's finish reason "error", its output holding only the tokens
    the grammar accepted, and the other requests of the batch give the
    tokens they give alone."""
    yes_no = StructuredOutputsParams(choice=["yes", "no"])
    masked = [
        # Neither "y" (121) nor "n" (110) may start the answer: nothing at all.
        (SamplingParams(temperature=0.0, max_tokens=8, allowed_token_ids=[ord("q")],
                        structured_outputs=yes_no), []),
        # "y" is accepted, then "e" and "a" are both masked: "y" alone.
        (SamplingParams(temperature=0.0, max_tokens=8, bad_words=["e", "a"],
                        structured_outputs=StructuredOutputsParams(choice=["yes", "yak"])),
         [ord("y")]),
    ]
    others = [("Pick one:", choice_params(None)),
              ("Hello there", SamplingParams(temperature=0.0, max_tokens=12)),
              ("Once upon", SamplingParams(temperature=1.0, seed=3, max_tokens=12))]
    with LLM(model=tiny_dir, device="cpu", async_scheduling=async_scheduling) as llm:
        alone = [llm.generate(prompt, p)[0].outputs[0] for prompt, p in others]
        prompts = ["Pick:", *[prompt for prompt, _ in others], "Pick:"]
        params = [masked[0][0], *[p for _, p in others], masked[1][0]]
        outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for completion, (_, kept) in zip([outputs[0], outputs[-1]], masked):
        assert completion.finish_reason == "error"
        assert completion.token_ids == kept
        assert completion.text == "".join(map(chr, kept))
    assert alone[0].finish_reason == "stop" and alone[0].text in CHOICES
    for got, want in zip(outputs[1:-1], alone):
        assert (got.token_ids, got.text, got.finish_reason) == (
            want.token_ids, want.text, want.finish_reason)


@pytest.mark.timeout(300)
def test_the_deepest_schema_taken_is_served_and_one_past_python_recursion_is_refused(tiny_dir):
    """A schema nested ``MAX_SCHEMA_DEPTH`` (124) levels deep compiles and
    its answer is its one shape, a digit in 123 arrays of one item (worked
    out by hand: ``jsonschema`` itself recurses too deep to validate it);
    one nested 1000 deep, assigned to parameters
    after they were made, is an ``InvalidRequestError`` from ``generate``
    (not a ``RecursionError``), nothing of the batch is scheduled, and the
    engine serves the deepest one again after it."""
    deepest = nested_arrays(MAX_SCHEMA_DEPTH)
    params = SamplingParams(temperature=0.0, max_tokens=2 * MAX_SCHEMA_DEPTH + 8,
                            structured_outputs=StructuredOutputsParams(
                                json=deepest, disable_any_whitespace=True))
    with LLM(model=tiny_dir, device="cpu") as llm:
        first = llm.generate(PROMPT, params)[0].outputs[0]
        assert first.finish_reason == "stop", first
        arrays = MAX_SCHEMA_DEPTH - 1
        assert re.fullmatch(rf"\[{{{arrays}}}[0-9]\]{{{arrays}}}", first.text), first.text
        too_deep = SamplingParams(temperature=0.0, max_tokens=4)
        too_deep.structured_outputs = {"json": nested_arrays(1000)}
        with pytest.raises(InvalidRequestError, match="more than 124 levels deep"):
            llm.generate([PROMPT, PROMPT], [params, too_deep])
        assert not llm.engine.has_unfinished_requests()
        again = llm.generate(PROMPT, params)[0].outputs[0]
    assert (again.text, again.finish_reason) == (first.text, "stop")
