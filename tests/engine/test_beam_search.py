"""``LLM.beam_search`` (vLLM's): with end-of-sequence ids ignored, the
sequences and scores of transformers' own beam search on the same weights
(float32, tiny); the score's rule and the checks, worked by hand. The
end-of-sequence and length-penalty paths are checked on SmolLM2 in
tests/checkpoint/test_gguf_beam_search.py."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from pytest import approx

from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, BeamSearchParams
from engine.beam_search import BeamSearchSequence, score

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45], [100]]
MAX_MODEL_LEN = 32


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def llm(cache):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPRUN_CACHE", cache)
    with LLM(model="tiny", device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN) as llm:
        yield llm
    mp.undo()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("beam_width", [1, 4])
def test_sequences_are_transformers_beams_when_eos_is_ignored(llm, cache, beam_width):
    """Without end-of-sequence ids all beams have one length, so vLLM's
    score and transformers' rank alike: the same sequences, in order, and
    cumulative logprobs of transformers' scores times the new tokens."""
    steps = 6
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ensure_tiny_model(cache), dtype=torch.float32).eval()
    outs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS],
                           BeamSearchParams(beam_width=beam_width, max_tokens=steps,
                                            ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), num_beams=beam_width,
                                  num_return_sequences=beam_width, do_sample=False,
                                  max_new_tokens=steps, eos_token_id=None, pad_token_id=0,
                                  output_scores=True, return_dict_in_generate=True)
        assert [s.tokens for s in out.sequences] == want.sequences.tolist()
        got = torch.tensor([s.cum_logprob for s in out.sequences])
        reference = (want.sequences_scores * steps if beam_width > 1
                     else torch.tensor([_greedy_logprob(model, prompt, want.sequences[0])]))
        torch.testing.assert_close(got, reference.float(), atol=1e-3, rtol=0)
        for s in out.sequences:
            assert s.finish_reason == "length" and len(s.logprobs) == steps
            assert s.text == llm.get_tokenizer().decode(s.tokens)


def _greedy_logprob(model, prompt: list[int], sequence: torch.Tensor) -> float:
    """The summed logprobs of ``sequence``'s new tokens under ``model``."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(sequence[None]).logits[0].float(), dim=-1)
    return sum(logprobs[i - 1, sequence[i]].item() for i in range(len(prompt), len(sequence)))


@pytest.mark.timeout(120)
def test_a_beam_at_the_context_end_stays(llm):
    """A prompt 2 short of the context: two steps fill it, then the beams
    stay as they are however many tokens were asked for."""
    out = llm.beam_search({"prompt_token_ids": [9] * (MAX_MODEL_LEN - 2)},
                          BeamSearchParams(beam_width=2, max_tokens=10, ignore_eos=True))
    assert [len(s.tokens) for s in out[0].sequences] == [MAX_MODEL_LEN] * 2


def test_score_worked_by_hand():
    """-6 over 3 tokens (prompt 1 + 2) at penalty 1: -2; at penalty 2: -6/9;
    a final end-of-sequence id does not count: -6 / 2."""
    eos = frozenset({9})
    assert score(BeamSearchSequence([1, 2, 3], cum_logprob=-6.0), eos, 1.0) == approx(-2.0)
    assert score(BeamSearchSequence([1, 2, 3], cum_logprob=-6.0), eos, 2.0) == approx(-6 / 9)
    assert score(BeamSearchSequence([1, 2, 9], cum_logprob=-6.0), eos, 1.0) == approx(-3.0)
    assert score(BeamSearchSequence([1, 2, 9], cum_logprob=0.0), eos, 1.0) == 0.0
    # A penalty whose power leaves the float range gives a number, no error;
    # so does a sequence that is one end-of-sequence id (length 0 counts 1).
    for penalty in (1e30, -1e308, float("inf"), float("-inf")):
        for tokens in ([1, 2, 3], [1, 9], [9]):
            assert math.isfinite(score(BeamSearchSequence(tokens, cum_logprob=-1.5), eos,
                                       penalty))
    assert score(BeamSearchSequence([9], cum_logprob=-1.5), eos, 2.0) == approx(-1.5)


@pytest.mark.timeout(120)
def test_bad_params_are_refused_before_anything_runs(llm):
    with pytest.raises(ValueError, match=r"beam_width 11 needs 22 logprobs a token, more than "
                                         r"max_logprobs 20"):
        llm.beam_search("hi", BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1, got 0"):
        llm.beam_search("hi", BeamSearchParams(beam_width=2, max_tokens=0))
    with pytest.raises(ValueError, match="length_penalty must be a finite number, got inf"):
        llm.beam_search("hi", BeamSearchParams(beam_width=2, max_tokens=2,
                                               length_penalty=float("inf")))
    with pytest.raises(ValueError, match="leaves no room"):
        llm.beam_search({"prompt_token_ids": [3] * MAX_MODEL_LEN},
                        BeamSearchParams(beam_width=2, max_tokens=2))
    assert len(llm.beam_search("hi", BeamSearchParams(beam_width=2, max_tokens=2))[0]
               .sequences) == 2
