"""``LLM.beam_search`` on SmolLM2 where beams end: against a beam search
written out here over transformers' logprobs of the same GGUF file (float32),
following the rule of engine/beam_search.py's docstring - the top
2 * beam_width candidates of each beam, those ending in <|im_end|> complete,
the rest ranked by cumulative logprob / length ** length_penalty."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, BeamSearchParams

CHAT = ("<|im_start|>user\nWhat is 2 + 2? Answer with the number only.<|im_end|>\n"
        "<|im_start|>assistant\n")
IM_END = 2  # SmolLM2's end-of-sequence id


def reference(model, prompt: list[int], width: int, steps: int, penalty: float):
    """(tokens, cumulative logprob, ended) of the best ``width`` sequences."""

    def key(beam):
        tokens, cum, ended = beam
        return cum / ((len(tokens) - ended) ** penalty)

    live, done = [(prompt, 0.0, False)], []
    for _ in range(steps):
        grown = []
        for tokens, cum, _ in live:
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, -1].float()
            top = torch.topk(torch.log_softmax(logits, dim=-1), 2 * width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist()):
                child = (tokens + [token], cum + logprob, token == IM_END)
                (done if child[2] else grown).append(child)
        live = sorted(grown, key=key, reverse=True)[:width]
    return sorted(done + live, key=key, reverse=True)[:width]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ended_beams_and_length_penalty_follow_the_rule(smollm2, smollm2_hf_tokenizer,
                                                        smollm2_hf_model):
    prompt = smollm2_hf_tokenizer(CHAT).input_ids
    with LLM(model=smollm2, device="cpu", dtype="float32", max_model_len=256) as llm:
        assert set(llm.engine.model_config.eos_token_ids) == {IM_END}
        for width, steps, penalty in ((3, 10, 1.0), (2, 10, 2.0)):
            [out] = llm.beam_search({"prompt_token_ids": prompt},
                                    BeamSearchParams(beam_width=width, max_tokens=steps,
                                                     length_penalty=penalty))
            want = reference(smollm2_hf_model, prompt, width, steps, penalty)
            assert any(ended for _, _, ended in want)  # the path under test is taken
            assert [s.tokens for s in out.sequences] == [t for t, _, _ in want]
            assert [s.finish_reason for s in out.sequences] == [
                "stop" if ended else "length" for _, _, ended in want]
            for s, (_, cum, _) in zip(out.sequences, want):
                assert s.cum_logprob == pytest.approx(cum, abs=1e-3)
