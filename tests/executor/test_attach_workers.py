"""Workers started elsewhere, as torchrun starts them (RANK, LOCAL_RANK,
WORLD_SIZE, ... and `-m worker`), attach to the engine's endpoints."""

import os
import subprocess
import sys

import pytest

from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, SamplingParams
from executor.multiproc import free_port
from tests.helpers.proc_utils import ROOT, pythonpath
from worker.env import TorchrunEnv


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("output_channel", [True, False], ids=["output", "reply-only"])
def test_torchrun_style_workers_attach_and_match_spawned(tmp_path, output_channel):
    """With ``--output`` step outputs take the output channel; without it
    (an older command line) the reply channel, and the reader settles them."""
    tiny = ensure_tiny_model(str(tmp_path / "cache"))
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir(mode=0o700)
    prompts = [{"prompt_token_ids": [1, 2, 3, 4]}, "attach me"]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(model=tiny, tensor_parallel_size=2, device="cpu") as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    workers = []
    port = free_port()  # one store for both ranks
    for rank in range(2):
        env = TorchrunEnv(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                          master_addr="127.0.0.1", master_port=port)
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "worker", "--broadcast", f"ipc://{sock_dir}/broadcast",
             "--reply", f"ipc://{sock_dir}/reply", "--device", "cpu",
             *(["--output", f"ipc://{sock_dir}/output"] if output_channel else [])],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=pythonpath(), **env.as_environ())))
    try:
        with LLM(model=tiny, tensor_parallel_size=2, device="cpu",
                 attach_workers_dir=str(sock_dir)) as llm:
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert got == want
        for proc in workers:  # the executor's shutdown call ends them
            assert proc.wait(timeout=15) == 0
        assert list(sock_dir.iterdir()) == []
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
