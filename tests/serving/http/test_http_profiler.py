"""The profiler behind ``tprun serve``: ``--profiler-config '{"profiler":
"torch", "torch_profiler_dir": DIR}'`` serves vLLM's ``POST /start_profile``
and ``POST /stop_profile`` (200, no body); a completion (the official
``openai`` client) between them lands in each worker's trace (TP=2: one
file per rank, both holding ``aten::mm``), and ``tprun bench serve
--profile`` calls both around its run. Without the config the routes are
not served (404) and bench serve says so and still runs. ``AsyncLLM``'s
``start_profile`` / ``stop_profile`` go through the same engine loop, as
engine controls beside sleep mode's; a data-parallel server writes a trace
for every rank of every replica.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import openai
import pytest

from serving.async_llm import AsyncLLM
from tests.helpers.http_utils import serving_tiny
from tests.helpers.proc_utils import ROOT, pythonpath
from tests.helpers.profiler_traces import TRACE, names, traces


def profiling(directory) -> str:
    return f'{{"profiler": "torch", "torch_profiler_dir": "{directory}", ' \
           '"torch_profiler_with_stack": false}'


@pytest.fixture(scope="module")
def traces_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def server(tmp_path_factory, traces_dir):
    with serving_tiny(tmp_path_factory.mktemp("profiled"), "--nproc-per-node", "2", "serve",
                      "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                      "--profiler-config", profiling(traces_dir)) as served:
        yield served


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("plain"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats") as served:
        yield served


def bench(server, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath(),
               TPRUN_CACHE=os.path.dirname(server.model_dir))
    return subprocess.run(
        [sys.executable, "-m", "launch", "bench", "serve", "--base-url", server.url,
         "--model", "tiny", "--tokenizer", server.model_dir, "--disable-tqdm",
         "--random-input-len", "8", "--random-output-len", "3", "--num-prompts", "2",
         "--temperature", "0", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)


@pytest.mark.timeout(300)
def test_start_completion_stop_writes_every_ranks_trace(server, traces_dir):
    before = set(traces(traces_dir))
    start = httpx.post(f"{server.url}/start_profile", timeout=120)
    assert (start.status_code, start.content) == (200, b"")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    answer = client.completions.create(model="tiny", prompt="Hello", max_tokens=4,
                                       temperature=0)
    assert answer.usage.completion_tokens == 4
    stop = httpx.post(f"{server.url}/stop_profile", timeout=120)
    assert (stop.status_code, stop.content) == (200, b"")
    found = traces(traces_dir)
    new = set(found) - before
    assert sorted(TRACE.match(n).group("tp", "rank") for n in new) == [("0", "0"), ("1", "1")]
    for name in new:
        assert "aten::mm" in names(found[name])


@pytest.mark.timeout(300)
def test_bench_serve_profile_starts_and_stops_the_profiler(server, traces_dir):
    before = set(traces(traces_dir))
    proc = bench(server, "--profile")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    order = ["Starting profiler...", "Profiler started", "Stopping profiler...",
             "Profiler stopped"]
    assert [line for line in lines if line in order] == order
    assert lines.index("Profiler stopped") < lines.index(
        next(line for line in lines if "Serving Benchmark Result" in line))
    assert "Successful requests:                     2" in proc.stdout
    found = traces(traces_dir)
    new = set(found) - before
    assert len(new) == 2 and all("aten::mm" in names(found[n]) for n in new)


@pytest.mark.timeout(300)
def test_without_a_config_no_routes_and_bench_serve_runs_on(plain_server):
    for route in ("/start_profile", "/stop_profile"):
        assert httpx.post(f"{plain_server.url}{route}", timeout=30).status_code == 404
    proc = bench(plain_server, "--profile")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: /start_profile failed (HTTP 404" in proc.stdout
    assert "WARNING: /stop_profile failed (HTTP 404" in proc.stdout
    assert "Successful requests:                     2" in proc.stdout


@pytest.mark.timeout(240)
def test_async_llm_profiles_through_its_engine_loop(tiny_dir, tmp_path):
    from engine import SamplingParams

    async def run(llm: AsyncLLM) -> list[int]:
        await llm.start_profile("async")
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        outs = [out async for out in llm.generate({"prompt_token_ids": [1, 72]}, params, "r")]
        await llm.stop_profile()
        return outs[-1].outputs[0].token_ids

    directory = tmp_path / "traces"
    llm = AsyncLLM(model=tiny_dir, device="cpu",
                   profiler_config={"profiler": "torch", "torch_profiler_dir": str(directory)})
    try:
        # A directory that cannot be made (a file took its path after the
        # config was checked): the start fails, the engine serves on.
        directory.write_text("")
        with pytest.raises(RuntimeError, match="File exists"):
            asyncio.run(llm.start_profile())
        directory.unlink()
        assert len(asyncio.run(run(llm))) == 3
    finally:
        llm.shutdown()
    (name, events), = traces(directory).items()
    assert TRACE.match(name).group("prefix") == "async"
    assert "aten::mm" in names(events)

    plain = AsyncLLM(model=tiny_dir, device="cpu")
    try:
        with pytest.raises(RuntimeError, match="^Profiling is not enabled"):
            asyncio.run(plain.start_profile())
    finally:
        plain.shutdown()


@pytest.mark.timeout(240)
def test_profiler_and_sleep_mode_share_the_engine_controls(tiny_dir, tmp_path):
    """The profiler's start and stop are engine controls (``EngineControl``),
    answered in the one order a client sent them with sleep mode's; sleep
    mode's wait ``control_timeout_s`` at most, the profiler's without limit."""
    from serving.protocol_core import EngineStoppedError

    async def run(llm: AsyncLLM) -> list:
        client = await llm._connect()
        client.control_timeout_s = 0  # a timed control gives up at once
        with pytest.raises(EngineStoppedError, match="did not answer is_sleeping"):
            await client.control("is_sleeping")
        await llm.start_profile("shared")  # untimed: it waits for its answer
        client.control_timeout_s = 120
        answers = await asyncio.gather(client.control("sleep", level=1),
                                       client.control("stop_profile"),
                                       client.control("is_sleeping"))
        await llm.wake_up()
        return answers

    directory = tmp_path / "traces"
    llm = AsyncLLM(model=tiny_dir, device="cpu", enable_sleep_mode=True,
                   profiler_config={"profiler": "torch", "torch_profiler_dir": str(directory)})
    try:
        answers = asyncio.run(run(llm))
    finally:
        llm.shutdown()
    assert [(a.method, a.value, a.error) for a in answers] == [
        ("sleep", True, None), ("stop_profile", False, None), ("is_sleeping", True, None)]
    (name,) = traces(directory)
    assert TRACE.match(name).group("prefix") == "shared"


@pytest.mark.timeout(300)
def test_data_parallel_server_writes_a_trace_per_replica(tmp_path):
    directory = tmp_path / "dp"
    with serving_tiny(tmp_path, "--nproc-per-node", "2", "serve", "--data-parallel-size", "2",
                      "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                      "--profiler-config", profiling(directory)) as served:
        assert httpx.post(f"{served.url}/start_profile", timeout=120).status_code == 200
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        for prompt in ("Hello", "World"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert httpx.post(f"{served.url}/stop_profile", timeout=120).status_code == 200
    found = sorted(traces(directory))
    assert [n.split(".")[0] for n in found] == ["dp0_pp0_tp0_dcp0_ep0_rank0",
                                                "dp1_pp0_tp0_dcp0_ep0_rank1"]


SHUTDOWN_WHILE_RECORDING = """
import asyncio, sys
from engine import SamplingParams
from serving.async_llm import AsyncLLM

async def run(llm):
    await llm.start_profile("left")
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    return [out async for out in llm.generate({"prompt_token_ids": [1, 72]}, params, "r")]

llm = AsyncLLM(model=sys.argv[1], device="cpu",
               profiler_config={"profiler": "torch", "torch_profiler_dir": sys.argv[2]})
try:
    asyncio.run(run(llm))
finally:
    llm.shutdown()  # no stop_profile: the trace is written at shutdown
"""


@pytest.mark.timeout(240)
def test_an_async_llm_shut_down_while_recording_writes_its_trace(tiny_dir, tmp_path):
    """vLLM writes a recording's trace at shutdown; the in-process worker's
    profiler must be stopped by the engine loop's thread, which started it
    (stopped from the thread that shuts the engine down, the profiler's
    library ends the process with a segmentation fault)."""
    directory = tmp_path / "traces"
    proc = subprocess.run([sys.executable, "-c", SHUTDOWN_WHILE_RECORDING, str(tiny_dir),
                           str(directory)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=pythonpath()),
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (name, events), = traces(directory).items()
    assert TRACE.match(name).group("prefix") == "left"
    assert "aten::mm" in names(events)
