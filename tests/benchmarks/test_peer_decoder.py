"""benchmarks/peer_decoder.py: the torch.compile peer computes what HF's Llama computes.

CPU, float32, a tiny Llama-3 shape (Llama-3 RoPE scaling, GQA, untied and
tied heads). The reference is transformers' LlamaForCausalLM on the same
weights: logits of a prefill, then greedy tokens; the compiled step
(inductor, the same ``compile_step`` the benchmark uses) must give the
tokens the eager step gives.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from benchmarks.peer_decoder import (
    PeerConfig,
    PeerDecoder,
    compile_step,
    generate,
    greedy_step,
    inverse_frequencies,
)
from benchmarks.shapes import hf_config, shape_config

NEW_TOKENS = 6


def hf_and_peer(tied: bool, max_len: int, batch: int):
    torch.manual_seed(0)
    config = hf_config("tiny")
    config.tie_word_embeddings = tied
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so their weights matter
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    fields = {**shape_config("tiny"), "tie_word_embeddings": tied}
    peer = PeerDecoder(PeerConfig.from_dict(fields), batch, max_len, torch.float32, "cpu")
    peer.load_hf_state_dict(hf.state_dict())
    return hf, peer


@pytest.mark.parametrize("tied", [False, True])
def test_prefill_logits_and_greedy_tokens_match_hf(tied):
    prompt = torch.randint(3, 512, (2, 9), generator=torch.Generator().manual_seed(1))
    hf, peer = hf_and_peer(tied, max_len=32, batch=2)
    with torch.no_grad():
        want = hf(prompt).logits
        got = peer(prompt, torch.arange(prompt.shape[1]))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        hf_tokens = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False, pad_token_id=0)[:, prompt.shape[1]:]
    peer.set_cache(2, 32)
    assert torch.equal(generate(peer, greedy_step, prompt, NEW_TOKENS), hf_tokens)


def test_llama3_frequencies_match_hf():
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_config("tiny"))
    want = rotary.inv_freq.float()
    fields = shape_config("tiny")
    got = inverse_frequencies(fields["head_dim"], fields["rope_theta"], fields["rope_scaling"])
    torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    plain = inverse_frequencies(fields["head_dim"], fields["rope_theta"], None)
    assert not torch.allclose(plain, want)  # the scaling changes some frequencies


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_step_matches_eager_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    prompt = torch.randint(3, 512, (3, 7), generator=torch.Generator().manual_seed(2))
    _, peer = hf_and_peer(False, max_len=24, batch=3)
    eager = generate(peer, greedy_step, prompt, NEW_TOKENS)
    torch._dynamo.reset()
    peer.set_cache(3, 24)
    compiled = generate(peer, compile_step("reduce-overhead"), prompt, NEW_TOKENS)
    assert torch.equal(compiled, eager)
