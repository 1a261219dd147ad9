"""vLLM's ``logprob_token_ids``: each sampled token reports the logprobs of
exactly these ids (in the list's order, numbered 1.. as vLLM numbers them)
and its own, in place of its top ones. Greedy over ``LLM.generate``, the
values are transformers' log-softmax of the same sequence at each step; a
batch mixing requests with and without the field, and with plain top
logprobs, answers each as it asked, a slot freed by a request with ids too,
and drafted tokens report what undrafted ones do; bad lists are refused
naming the field."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from ipc.errors import InvalidRequestError
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.prompt_logprobs import hf_prompt_logprobs

VOCAB = 256
PROMPTS = [[5, 17, 99, 3], [(7 * i) % 200 + 1 for i in range(23)], [40, 41, 42]]
IDS = [7, 200, 3, 255, 0, 7]  # a repeated id, the first and the last of the vocabulary
MANY = [(13 * i) % VOCAB for i in range(128)]  # the most a request may ask for


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = small_llama(5, VOCAB, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512)
    return save_spread(model, tmp_path_factory.mktemp("llama_logprob_ids")), model


def _check(completion, prompt, ids, model, tol: float = 1e-4) -> None:
    sequence = prompt + list(completion.token_ids)
    ref = hf_prompt_logprobs(model, sequence)  # row j: the distribution of token j + 1
    assert len(completion.logprobs) == len(completion.token_ids)
    for i, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = ref[len(prompt) - 1 + i]
        assert token == int(row.argmax())  # greedy, as transformers
        assert set(entry) == set(ids) | {token}
        for t in set(ids) | {token}:
            assert entry[t].logprob == pytest.approx(float(row[t]), abs=tol), (i, t)
        for t in set(ids) - {token}:  # numbered by place, a repeated id by its last
            assert entry[t].rank == len(ids) - ids[::-1].index(t), (i, t)
        assert entry[token].rank == 1  # the greedy token's own rank in the vocabulary


# On CUDA: the Triton logprobs launch, the slots' id table on the device,
# decode CUDA graphs; float32 there, within the CUDA tests' tolerance.
DEVICES = [("cpu", {}, 1e-4), pytest.param(
    "cuda", {"dtype": "float32"}, 1e-3,
    marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device, options, tol", DEVICES)
def test_logprobs_of_the_asked_ids_match_transformers_in_a_mixed_batch(llama, device, options,
                                                                        tol):
    path, model = llama
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                             logprob_token_ids=IDS, logprobs=len(IDS)),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                             logprob_token_ids=MANY)]
    prompts = [*PROMPTS, PROMPTS[0]]
    with LLM(model=path, device=device, max_num_seqs=4, max_num_batched_tokens=64,
             **options) as llm:
        with_ids, plain, top, many = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                  params)
    _check(with_ids.outputs[0], PROMPTS[0], IDS, model, tol)
    _check(many.outputs[0], PROMPTS[0], MANY, model, tol)
    assert plain.outputs[0].logprobs is None
    # The plain top-3 row of the same batch keeps its own top tokens.
    sequence = PROMPTS[2] + list(top.outputs[0].token_ids)
    ref = hf_prompt_logprobs(model, sequence)
    for i, entry in enumerate(top.outputs[0].logprobs):
        row = ref[len(PROMPTS[2]) - 1 + i]
        assert set(entry) == set(row.topk(3).indices.tolist())
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(float(row[t]), abs=tol)


@pytest.mark.parametrize("fields, words", [
    ({"logprob_token_ids": list(range(129))}, "more than the 128 allowed"),
    ({"logprob_token_ids": [3, -1]}, ">= 0"),
    ({"logprob_token_ids": [3, 4], "logprobs": 5}, "their number 2"),
    ({"logprob_token_ids": ["a"]}, "list of ints"),
])
def test_bad_lists_name_the_field(fields, words):
    with pytest.raises(InvalidRequestError, match=words) as caught:
        SamplingParams(**fields)
    assert caught.value.param == "logprob_token_ids"


@pytest.mark.timeout(180)
def test_ids_outside_the_vocabulary_are_refused(llama):
    path, _ = llama
    with LLM(model=path, device="cpu", max_num_seqs=2) as llm:
        with pytest.raises(InvalidRequestError, match="outside the vocabulary") as caught:
            llm.generate([{"prompt_token_ids": PROMPTS[0]}],
                         SamplingParams(max_tokens=2, logprob_token_ids=[1, VOCAB]))
    assert caught.value.param == "logprob_token_ids"


@pytest.mark.timeout(180)
def test_a_slot_freed_by_a_request_with_ids_keeps_none_for_the_next(llama):
    """The next request in the slot (a runner reuses the slot freed last)
    asks for plain top logprobs beside one that asks for ids: it gets its
    own top tokens, not the ids of the slot's previous request."""
    path, model = llama
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2)
    listed = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                            logprob_token_ids=IDS[:2])
    with LLM(model=path, device="cpu", max_num_seqs=2) as llm:
        llm.generate([{"prompt_token_ids": PROMPTS[1]}], listed)
        top, again = llm.generate([{"prompt_token_ids": PROMPTS[2]},
                                   {"prompt_token_ids": PROMPTS[0]}], [plain, listed])
    ref = hf_prompt_logprobs(model, PROMPTS[2] + list(top.outputs[0].token_ids))
    for i, entry in enumerate(top.outputs[0].logprobs):
        assert set(entry) == set(ref[len(PROMPTS[2]) - 1 + i].topk(2).indices.tolist())
    _check(again.outputs[0], PROMPTS[0], IDS[:2], model)


@pytest.mark.timeout(300)
def test_drafted_tokens_report_the_ids_as_without_drafts():
    """With n-gram drafts (accepted ones too), each emitted token reports the
    same ids' logprobs as without speculative decoding."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
             "prompt_lookup_min": 1}
    prompts = ["abcabcabcabcabcabc", "the cat sat on the mat; the cat sat on the"]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                            logprob_token_ids=[97, 98, 99, 32])
    outs = {}
    for name, spec in (("plain", None), ("spec", ngram)):
        with LLM(model="tiny", device="cpu", speculative_config=spec) as llm:
            outs[name] = [o.outputs[0] for o in llm.generate(prompts, params)]
            if spec:
                assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0
    for plain, spec in zip(outs["plain"], outs["spec"]):
        assert spec.token_ids == plain.token_ids
        for token, want, got in zip(spec.token_ids, plain.logprobs, spec.logprobs,
                                    strict=True):
            assert set(got) == set(want) == {97, 98, 99, 32, token}
            for t in want:
                assert got[t].logprob == pytest.approx(want[t].logprob, abs=1e-4)
                assert got[t].rank == want[t].rank
