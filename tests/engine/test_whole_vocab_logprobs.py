"""``logprobs=-1`` and ``prompt_logprobs=-1`` (vLLM's "the whole vocabulary"):
with ``max_logprobs=-1`` every token gets every vocabulary entry, equal to
transformers' log-softmax of the same sequence; under the default cap (20,
smaller than the 256-token vocabulary) such a request is refused, naming
the field."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.prompt_logprobs import hf_prompt_logprobs

VOCAB = 256
PROMPTS = [[5, 17, 99, 3], [(7 * i) % 200 + 1 for i in range(23)]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A small random Llama saved with a tokenizer, and the HF model itself."""
    model = small_llama(5, VOCAB, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512)
    return save_spread(model, tmp_path_factory.mktemp("llama_whole_vocab")), model


def _generate(path, params, **kw):
    with LLM(model=path, device="cpu", max_num_batched_tokens=16, block_size=16,
             max_num_seqs=4, **kw) as llm:
        return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)


def _check_row(entry, ref: torch.Tensor, where: str) -> None:
    """``entry`` (token id -> Logprob) holds every vocabulary token with
    its reference logprob and its rank among them."""
    assert len(entry) == VOCAB, where
    assert set(entry) == set(range(VOCAB)), where
    got = torch.tensor([entry[t].logprob for t in range(VOCAB)], dtype=torch.float64)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0, msg=where)
    best = int(ref.argmax())
    assert entry[best].rank == 1, where


@pytest.mark.timeout(180)
def test_whole_vocab_logprobs_match_transformers(llama):
    path, model = llama
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=-1, prompt_logprobs=-1)
    outs = _generate(path, params, max_logprobs=-1)
    for out, prompt in zip(outs, PROMPTS, strict=True):
        completion = out.outputs[0]
        sequence = prompt + list(completion.token_ids)
        ref = hf_prompt_logprobs(model, sequence)  # row j: distribution of token j + 1
        assert len(completion.logprobs) == len(completion.token_ids) == 3
        for i, entry in enumerate(completion.logprobs):
            _check_row(entry, ref[len(prompt) - 1 + i], f"output token {i}")
        assert out.prompt_logprobs[0] is None
        for j in range(1, len(prompt)):
            _check_row(out.prompt_logprobs[j], ref[j - 1], f"prompt position {j}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_whole_vocab_refused_under_the_default_cap(llama, field):
    path, _ = llama
    params = SamplingParams(temperature=0.0, max_tokens=2, **{field: -1})
    with pytest.raises(ValueError, match=rf"{field} -1 \(the whole vocabulary, 256 tokens\) "
                                         r"is more than max_logprobs 20"):
        _generate(path, params)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_below_minus_one_is_refused(field):
    with pytest.raises(ValueError, match=rf"{field} must be None, an int >= 0 or -1"):
        SamplingParams(**{field: -2})


@pytest.mark.timeout(300)
def test_whole_vocab_prompt_logprobs_over_many_chunks_match_transformers(monkeypatch, tmp_path):
    """``tiny`` (320 vocabulary rows: 321 entries a scored position), its
    steps held to 40 whole-vocabulary positions: a 300-token prompt scores
    its 299 positions over 8 prefill chunks (7 of 40 tokens, then the last
    20, which score 19) where the token budget alone (2048) takes it in one,
    and every position holds every vocabulary token at transformers'
    log-softmax of the prompt, ranked."""
    import transformers

    from checkpoint.tiny_model import ensure_tiny_model
    from engine import prompt_logprobs
    from engine.scheduler import Scheduler

    path = ensure_tiny_model(str(tmp_path))
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    vocab = model.config.vocab_size
    monkeypatch.setattr(prompt_logprobs, "ENTRIES_PER_STEP", 40 * (vocab + 1))
    prompt = [(37 * i + 11) % 256 for i in range(300)]
    ref = hf_prompt_logprobs(model, prompt)
    chunks, schedule = [], Scheduler.schedule

    def recording(scheduler: Scheduler):
        plan = schedule(scheduler)
        chunks.extend(plan.num_scheduled_tokens)
        return plan

    monkeypatch.setattr(Scheduler, "schedule", recording)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=-1)
    with LLM(model=path, device="cpu", max_logprobs=-1) as llm:
        [out] = llm.generate([{"prompt_token_ids": prompt}], params)
    assert chunks == [40] * 7 + [20]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for j in range(1, len(prompt)):
        entry = out.prompt_logprobs[j]
        assert set(entry) == set(range(vocab)), j
        got = torch.tensor([entry[t].logprob for t in range(vocab)], dtype=torch.float64)
        torch.testing.assert_close(got, ref[j - 1], atol=1e-4, rtol=0, msg=f"position {j}")
        token = prompt[j]
        assert entry[token].rank == int((ref[j - 1] >= ref[j - 1][token] - 1e-9).sum()), j
