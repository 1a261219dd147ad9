"""Our paged, tensor-parallel models against Hugging Face transformers.

Each config is a random float32 HF model saved with save_pretrained. Two
requests run through the paged KV cache as the runner would drive them:
chunked prefill (the second chunk starts past the first block), a step with
padding tokens, then decode steps; block tables are shuffled. Every logit we
compute must match HF's logits on the full sequences. TP=2 runs in two
spawned gloo processes shared by all configs.
"""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runner.distributed import TensorParallelGroup
from tests.helpers.checkpoints import build_model_from_dir
from tests.helpers.kernel_device import KERNEL_DEVICE
from tests.helpers.model_parity import (
    BLOCK_SIZES,
    CONFIGS,
    check_close,
    run_scenario,
    save_hf_model,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, list[torch.Tensor]]]:
    root = tmp_path_factory.mktemp("parity")
    return {name: (str(root / name), save_hf_model(name, str(root / name))) for name in CONFIGS}


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tp1_matches_hf(checkpoints, name, block_size):
    model_dir, reference = checkpoints[name]
    model = build_model_from_dir(model_dir, torch.float32, torch.device("cpu"), TensorParallelGroup())
    check_close(run_scenario(model, block_size), reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral_window", "qwen2_window"])
def test_triton_backend_matches_hf(checkpoints, name):
    # The Triton attention backend (the interpreter on CPU, compiled with
    # CUDA): the model stores k and v from its rotary kernel and the backend
    # only attends.
    model_dir, reference = checkpoints[name]
    model = build_model_from_dir(model_dir, torch.float32, KERNEL_DEVICE, TensorParallelGroup(), "triton")
    assert model.layers[0].self_attn.fused_kv_write
    tol = 1e-4 if KERNEL_DEVICE.type == "cpu" else 1e-3  # as the CUDA test below
    check_close(run_scenario(model, BLOCK_SIZES[0], KERNEL_DEVICE), reference, tol=tol)


@pytest.mark.parametrize("name", ["mistral_window", "qwen2_window"])
def test_the_window_changes_the_logits(checkpoints, name, tmp_path):
    # Guards the two window configs above: the same weights without the
    # window give other logits, so their parity checks the window itself.
    import json
    import shutil

    model_dir, reference = checkpoints[name]
    shutil.copytree(model_dir, tmp_path / "full")
    config_path = tmp_path / "full" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(sliding_window=None, layer_types=None, use_sliding_window=False)
    config_path.write_text(json.dumps(config))
    model = build_model_from_dir(str(tmp_path / "full"), torch.float32, torch.device("cpu"),
                        TensorParallelGroup())
    assert model.config.sliding_window is None
    full = run_scenario(model, BLOCK_SIZES[0])
    assert not torch.allclose(full[0], reference[0], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_triton_path_matches_hf(checkpoints, name):
    # On CUDA the Triton kernels run: attention, KV write, fused add+norm,
    # rotary, SiLU-and-multiply. float32, so HF's CPU logits stay the oracle.
    model_dir, reference = checkpoints[name]
    cuda = torch.device("cuda")
    model = build_model_from_dir(model_dir, torch.float32, cuda, TensorParallelGroup())
    for block_size in BLOCK_SIZES:
        check_close(run_scenario(model, block_size, cuda), reference, tol=1e-3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, port: int, model_dirs: dict[str, str], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        tp = TensorParallelGroup.from_default_group()
        results = {}
        for name, model_dir in model_dirs.items():
            model = build_model_from_dir(model_dir, torch.float32, torch.device("cpu"), tp)
            results[name] = {bs: run_scenario(model, bs) for bs in BLOCK_SIZES}
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp2_results(checkpoints, tmp_path_factory) -> list[dict]:
    out = str(tmp_path_factory.mktemp("tp2"))
    dirs = {name: model_dir for name, (model_dir, _) in checkpoints.items()}
    mp.spawn(_tp_worker, args=(2, _free_port(), dirs, out), nprocs=2, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tp2_matches_hf(checkpoints, tp2_results, name):
    reference = checkpoints[name][1]
    for rank_results in tp2_results:
        for block_size in BLOCK_SIZES:
            check_close(rank_results[name][block_size], reference)
