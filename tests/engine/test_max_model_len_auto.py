"""vLLM's ``max_model_len`` -1 (``--max-model-len auto`` or ``-1``): the
longest length the KV cache holds, at most the model's positions, decided
once the cache is sized, said once at INFO, and the limit everything after
it uses (the scheduler, the request check, ``/v1/models``, the HTTP
routes).

References worked by hand: a block of tiny's cache (4 layers, 2 KV heads
of 16 dimensions, float32, a K and a V) is 16 * 4 * 2 * 2 * 16 * 4 = 16 KiB,
so 1 MiB holds 64 blocks of 16 = 1024 tokens, fewer than tiny's 4096
positions; the refusal is the usual context-length message."""

from __future__ import annotations

import logging

import openai
import pytest

from engine import LLM, SamplingParams
from tests.helpers.http_utils import openai_client, serving_tiny

TINY_POSITIONS = 4096
BLOCK_BYTES = 16 * 4 * 2 * 2 * 16 * 4
CACHE_BYTES = 1 << 20
HELD = CACHE_BYTES // BLOCK_BYTES * 16  # 1024


def _auto_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "max_model_len auto" in r.getMessage()]


@pytest.mark.timeout(180)
def test_auto_is_what_the_cache_holds_and_every_limit_uses_it(tmp_path, monkeypatch, caplog):
    """A prompt of HELD tokens is refused with the usual message; one of
    HELD - 24 runs to HELD tokens in all, "length"."""
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    caplog.set_level(logging.INFO, logger="engine.llm_engine")
    assert HELD == 1024 < TINY_POSITIONS
    with LLM(model="tiny", device="cpu", max_model_len=-1, kv_cache_memory_bytes=CACHE_BYTES,
             max_num_seqs=4) as llm:
        assert llm.engine.num_blocks == 64
        assert llm.engine.max_model_len == llm.engine.scheduler.config.max_model_len == HELD
        with pytest.raises(ValueError, match=r"prompt \(1024 tokens\) leaves no room for output "
                                             r"in max_model_len 1024, this model's maximum "
                                             r"context length"):
            llm.generate({"prompt_token_ids": [7] * HELD}, SamplingParams(max_tokens=1))
        params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
        out = llm.generate({"prompt_token_ids": [7] * (HELD - 24)}, params)[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (24, "length")
    assert _auto_lines(caplog) == [
        "max_model_len auto: 1024 tokens (the KV cache holds 1024: 64 blocks of 16; the model "
        "has 4096 positions)"]


@pytest.mark.timeout(120)
def test_auto_is_the_models_positions_where_the_cache_holds_more(tmp_path, monkeypatch, caplog):
    """300 blocks of 16 hold 4800 tokens: the model's 4096 positions bound it."""
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    caplog.set_level(logging.INFO, logger="engine.llm_engine")
    with LLM(model="tiny", device="cpu", max_model_len=-1, num_gpu_blocks_override=300) as llm:
        assert llm.engine.max_model_len == llm.engine.scheduler.config.max_model_len == 4096
    assert _auto_lines(caplog) == [
        "max_model_len auto: 4096 tokens (the KV cache holds 4800: 300 blocks of 16; the model "
        "has 4096 positions)"]


@pytest.mark.timeout(240)
def test_auto_on_the_command_line_reaches_the_http_routes(tmp_path):
    """``tprun serve --max-model-len auto``: /v1/models says HELD; a prompt
    plus max_tokens one past it is a 400 with the usual message, and the
    server goes on serving one that fits exactly."""
    with serving_tiny(tmp_path, "serve", "--model", "tiny", "--device", "cpu",
                      "--max-model-len", "auto", "--kv-cache-memory-bytes", "1M") as served:
        with openai_client(served) as client:
            [model] = client.models.list().data
            assert model.model_extra["max_model_len"] == HELD
            with pytest.raises(openai.BadRequestError, match="exceeds max_model_len 1024"):
                client.completions.create(model="tiny", prompt=[7] * (HELD - 3), max_tokens=4)
            done = client.completions.create(model="tiny", prompt=[7] * (HELD - 4),
                                             max_tokens=4, temperature=0.0,
                                             extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 4 and done.choices[0].finish_reason == "length"


def test_auto_with_a_cache_of_one_token_is_refused_before_any_worker(no_workers):
    """One block of one token holds no prompt token and output token."""
    with pytest.raises(ValueError, match=r"^max_model_len auto: the KV cache holds 1 token "
                                         r"\(1 block of 1\), fewer than a prompt token and an "
                                         r"output token: raise num_gpu_blocks_override$"):
        LLM(model="tiny", device="cpu", max_model_len=-1, block_size=1,
            num_gpu_blocks_override=1)
    assert no_workers == []
