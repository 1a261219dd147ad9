"""``min_tokens``: stop token ids and end-of-sequence ids cannot end a request
before it has generated ``min_tokens`` tokens (vLLM masks them on the device;
so does the runner), and after that they end it as usual."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.min_tokens import min_tokens_stop_ids
from engine.request import Request
from ipc.messages import SamplingOptions
from runner.sampler import Sampler
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.sampler_writes import write_added_requests

PROMPT = [5, 17, 99, 3, 44, 120]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = small_llama(4, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256)
    return save_spread(model, tmp_path_factory.mktemp("llama_min_tokens")), model


def hf_greedy(model, prompt, steps, banned_until: int, banned: set[int]) -> list[int]:
    """Greedy decoding with ``banned`` ids masked for the first ``banned_until`` tokens."""
    tokens = list(prompt)
    with torch.no_grad():
        for k in range(steps):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            if k < banned_until:
                logits[list(banned)] = float("-inf")
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


@pytest.mark.timeout(180)
def test_stop_ids_held_back_until_min_tokens(llama):
    path, model = llama
    greedy = hf_greedy(model, PROMPT, 1, 0, set())
    stop = greedy[0]  # the token the request would otherwise stop at first
    with LLM(model=path, device="cpu", max_num_seqs=4) as llm:
        plain, held = llm.generate(
            [{"prompt_token_ids": PROMPT}] * 2,
            [SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]),
             SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop],
                            min_tokens=6)])
    assert plain.outputs[0].token_ids == [stop]
    assert plain.outputs[0].finish_reason == "stop"
    got = held.outputs[0].token_ids
    assert len(got) >= 6 and stop not in got[:6]
    expected = hf_greedy(model, PROMPT, len(got), 6, {stop})
    assert got == expected
    if held.outputs[0].finish_reason == "stop":
        assert got[-1] == stop and stop not in got[:-1]
    else:
        assert len(got) == 12


@pytest.mark.timeout(180)
def test_min_tokens_with_random_sampling(llama):
    """Seeded random draws over a tiny candidate set: the stop id never comes before."""
    path, _ = llama
    with LLM(model=path, device="cpu", max_num_seqs=8) as llm:
        outs = llm.generate(
            [{"prompt_token_ids": PROMPT}] * 8,
            [SamplingParams(temperature=1.5, top_k=3, max_tokens=10, seed=i, min_tokens=4,
                            stop_token_ids=list(range(0, 256, 2))) for i in range(8)])
    for out in outs:
        tokens = out.outputs[0].token_ids
        assert len(tokens) >= 4
        assert all(t % 2 for t in tokens[:4])
        if out.outputs[0].finish_reason == "stop":
            assert tokens[-1] % 2 == 0 and all(t % 2 for t in tokens[:-1])


def test_stop_ids_held_back_include_eos_even_when_ignored():
    """vLLM's rule: no EOS before ``min_tokens``, ``ignore_eos`` or not."""
    eos = {7, 9}
    held = Request("a", [1, 2], SamplingParams(min_tokens=3, stop_token_ids=[4]), eos)
    ignored = Request("b", [1, 2], SamplingParams(min_tokens=3, stop_token_ids=[4],
                                                  ignore_eos=True), eos)
    none = Request("c", [1, 2], SamplingParams(stop_token_ids=[4]), eos)
    assert min_tokens_stop_ids(held) == [4, 7, 9]
    assert min_tokens_stop_ids(ignored) == [4, 7, 9]
    assert min_tokens_stop_ids(none) == []


@pytest.mark.timeout(180)
def test_ignore_eos_still_holds_eos_back_until_min_tokens(llama):
    """An end-of-sequence id made the likeliest token everywhere (a bias of
    100): with ``ignore_eos`` it ends nothing, and, as vLLM, it is not drawn
    before ``min_tokens`` (HF's greedy tokens with it masked), then it is."""
    path, model = llama
    eos = model.config.eos_token_id
    with LLM(model=path, device="cpu", max_num_seqs=4) as llm:
        [out] = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(
            temperature=0.0, max_tokens=5, min_tokens=3, ignore_eos=True,
            logit_bias={eos: 100.0}))
    assert out.outputs[0].token_ids == hf_greedy(model, PROMPT, 3, 3, {eos}) + [eos, eos]
    assert out.outputs[0].finish_reason == "length"


def test_sampler_masks_eos_by_output_position():
    """Rows at output index 0..2 of a min_tokens=3 request never pick the
    masked ids, even where they have the largest logit; at index 3 they do."""
    vocab, prompt_len = 16, 5
    sampler = Sampler(4, vocab, torch.device("cpu"), seed=0)
    options = SamplingOptions(temperature=0.0, min_tokens=3)
    sampler.add_request(1, options, prompt_len, prompt_len, [0, 11])
    sampler.add_request(2, SamplingOptions(temperature=0.0), prompt_len, prompt_len)
    write_added_requests(sampler, torch.zeros(4, 32, dtype=torch.int32))
    logits = torch.zeros(5, vocab)
    logits[:, 11] = 5.0  # the stop id leads everywhere
    logits[:, 0] = 4.0  # the other stop id (column 0 is also the table's padding column)
    logits[:, 3] = 1.0
    slots = np.array([1, 1, 1, 1, 2], dtype=np.int32)
    positions = torch.tensor([5, 6, 7, 8, 5])  # output index 0, 1, 2, 3; the plain slot
    out = sampler(logits, torch.from_numpy(slots), slots, positions, torch.ones(5, dtype=bool))
    assert out.sampled_token_ids.tolist() == [3, 3, 3, 11, 11]


def test_min_tokens_validated():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=-1)
