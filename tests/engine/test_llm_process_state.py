"""What ``LLM`` shows and leaves in the caller's process.

Its progress bar moves with tokens: the postfix counts output tokens and
their rate after every step, before any request has finished. Its shutdown
gives the caller back the torch thread count the in-process worker (TP=1)
changed.
"""

from __future__ import annotations

import gc
import os
import re

import pytest
import torch

from engine import LLM, SamplingParams


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))


def test_shutdown_restores_the_callers_thread_count(tiny_cache, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    original = torch.get_num_threads()
    worker_share = max(1, (os.cpu_count() or 1) - 1)  # what the worker sets (worker.py)
    mine = worker_share + 2
    torch.set_num_threads(mine)
    try:
        with LLM(model="tiny", device="cpu") as llm:
            assert torch.get_num_threads() == worker_share  # the worker did change it
            llm.generate([{"prompt_token_ids": [1, 2]}], SamplingParams(max_tokens=2))
        assert torch.get_num_threads() == mine
        # Collected without shutdown(): the same.
        llm = LLM(model="tiny", device="cpu")
        assert torch.get_num_threads() == worker_share
        del llm
        gc.collect()
        assert torch.get_num_threads() == mine
    finally:
        torch.set_num_threads(original)


def test_progress_bar_moves_with_tokens(tiny_cache, capsys, monkeypatch):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as llm:
        from engine import progress

        monkeypatch.setattr(progress, "tqdm", _eager_tqdm(progress.tqdm))
        llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, params, use_tqdm=True)
    frames = re.split(r"[\r\n]", capsys.readouterr().err)
    before_first_done = [f for f in frames if "0/2" in f and "tok/s" in f]
    counts = [int(m.group(1)) for f in before_first_done if (m := re.search(r"(\d+) tok,", f))]
    assert len(set(counts)) >= 2, frames  # the bar moved while no request was done
    assert any("2/2" in f and "48 tok," in f for f in frames), frames


def _eager_tqdm(cls):
    """tqdm that redraws on every update (no time-based throttling)."""

    def make(*args, **kwargs):
        return cls(*args, mininterval=0, miniters=1, **kwargs)

    return make
