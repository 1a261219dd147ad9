"""``tprun serve --data-parallel-size 2 --http-port``: two engine replicas
behind one HTTP server (vLLM's ``-dp``).

One server for the module (``tiny`` on the CPU, a rank per replica):
answers equal ``LLM.generate``'s (the reference engine, in process),
concurrent requests spread over both replicas (each replica's own counters,
``/metrics`` with vLLM's ``engine`` label), the choices of one request
stay on one replica, an aborted stream frees its replica, and the ready
line names each replica's live endpoint. Then a
replica whose worker dies, or that is stopped alone, ends the server with
one line naming it; a stop (SIGTERM, Ctrl-C) ends every replica's streams
as the engine's stop; and a world size that is not -tp x -dp, a replica's
rendezvous port out of range or busy, or --attach-workers, is refused
before anything starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import LLM, SamplingParams
from serving.client import EngineClient
from tests.helpers.http_utils import serving_tiny, start_http, stop_http
from tests.helpers.proc_utils import child_pids, run_tprun, socket_dirs

PROMPTS = ["Hello, my name is", "The capital of France is"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("dp"), "--nproc-per-node", "2", "serve",
                      "--data-parallel-size", "2", "--model", "tiny", "--device", "cpu",
                      "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """``LLM.generate`` and ``LLM.chat`` of the same model, greedy."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    with LLM(model=tiny_dir, device="cpu") as llm:
        texts = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
        chat = llm.chat([{"role": "user", "content": PROMPTS[0]}], params)[0].outputs[0].text
    return texts, chat


def per_engine(url: str, name: str) -> dict[str, float]:
    """``name``'s value for each ``engine`` label of ``GET /metrics``."""
    page = httpx.get(f"{url}/metrics", timeout=30).text
    return {sample.labels["engine"]: sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples if sample.name == name}


@pytest.mark.timeout(180)
def test_completions_and_chat_match_llm_generate(server, client, reference):
    texts, chat = reference
    for prompt, text in zip(PROMPTS, texts):
        answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0.0)
        assert answer.choices[0].text == text
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}],
        max_tokens=MAX_TOKENS, temperature=0.0)
    assert answer.choices[0].message.content == chat
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200


@pytest.mark.timeout(180)
def test_concurrent_requests_land_on_both_replicas(server, client):
    """8 requests at once: the fewest-unfinished rule sends them to both
    replicas; each replica generated whole requests' tokens, all of them
    together every request's."""
    before = per_engine(server.url, "tprun:generation_tokens_total")
    assert set(before) == {"0", "1"}
    start = threading.Barrier(8)

    def ask(index: int) -> None:
        start.wait()
        client.completions.create(model="tiny", prompt=f"request {index}", max_tokens=40,
                                  temperature=0.0, extra_body={"ignore_eos": True})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = per_engine(server.url, "tprun:generation_tokens_total")
    made = {engine: after[engine] - before[engine] for engine in after}
    assert made["0"] > 0 and made["1"] > 0, made
    assert made["0"] % 40 == 0 and made["1"] % 40 == 0, made
    assert made["0"] + made["1"] == 8 * 40


@pytest.mark.timeout(180)
def test_the_choices_of_one_request_go_to_one_replica(server, client):
    before = per_engine(server.url, "tprun:generation_tokens_total")
    answer = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=10, n=4,
                                       temperature=1.0, extra_body={"ignore_eos": True})
    assert len(answer.choices) == 4
    after = per_engine(server.url, "tprun:generation_tokens_total")
    made = sorted(after[engine] - before[engine] for engine in after)
    assert made == [0, 40]


@pytest.mark.timeout(180)
def test_an_aborted_stream_frees_its_replica(server, client):
    stream = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=3000,
                                       temperature=0.0, stream=True,
                                       extra_body={"ignore_eos": True})
    for chunks, _ in enumerate(stream):
        if chunks == 3:
            break
    running = per_engine(server.url, "tprun:num_requests_running")
    assert running == {"0": 1.0, "1": 0.0}  # both empty before: the tie goes to replica 0
    stream.close()
    deadline = time.monotonic() + 30
    while sum(running.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        running = per_engine(server.url, "tprun:num_requests_running")
    assert running == {"0": 0.0, "1": 0.0}
    # The front end counts replica 0 empty again: of 3 requests at once it
    # takes the first and the third (counted busy still, it would take one).
    before = per_engine(server.url, "tprun:generation_tokens_total")
    barrier = threading.Barrier(3)

    def ask() -> None:
        barrier.wait()
        client.completions.create(model="tiny", prompt="again", max_tokens=30, temperature=0.0,
                                  extra_body={"ignore_eos": True})

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = per_engine(server.url, "tprun:generation_tokens_total")
    assert {engine: after[engine] - before[engine] for engine in after} == {"0": 60, "1": 30}


@pytest.mark.timeout(180)
def test_the_ready_line_names_every_replicas_endpoint(server, reference):
    """``tprun serve: ready: engine endpoints A (replica 0, key file KA),
    B (replica 1, key file KB)``: B with KB is replica 1's live endpoint
    (a client of it gets ``LLM.generate``'s answer, counted on engine "1"
    only)."""
    line = next(x for x in server.output().splitlines() if x.startswith("tprun serve: ready:"))
    named = re.fullmatch(r"tprun serve: ready: engine endpoints (\S+) \(replica 0, key file "
                         r"(\S+)\), (\S+) \(replica 1, key file (\S+)\)", line)
    assert named is not None, line
    first, first_key, second, second_key = named.groups()
    assert first.startswith("ipc://") and second.startswith("ipc://") and first != second
    assert os.path.isfile(first_key) and os.path.isfile(second_key)
    before = per_engine(server.url, "tprun:generation_tokens_total")
    with EngineClient(second, key_file=second_key) as replica:
        answer = replica.generate([PROMPTS[0]], SamplingParams(temperature=0.0,
                                                              max_tokens=MAX_TOKENS))
    assert answer[0].outputs[0].text == reference[0][0]
    after = per_engine(server.url, "tprun:generation_tokens_total")
    made = len(answer[0].outputs[0].token_ids)
    assert {engine: after[engine] - before[engine] for engine in after} == {"0": 0, "1": made}


@pytest.mark.timeout(240)
def test_a_replica_whose_worker_dies_ends_the_server_naming_it(tmp_path):
    """Two replicas of two ranks each; a worker of replica 1 (its local
    ranks 2 and 3) is killed: the server exits 1 with one error line naming
    the replica and its rank, and leaves no process nor socket directory."""
    sockets = tempfile.mkdtemp(prefix="dp")
    served = start_http(tmp_path, "--nproc-per-node", "4", "serve", "-dp", "2", "--model",
                        "tiny", "--device", "cpu", "--disable-log-stats",
                        env={"TMPDIR": sockets}, timeout_s=180)
    replica = next(pid for pid in child_pids(served.proc.pid)
                   if b"launch.replica" in open(f"/proc/{pid}/cmdline", "rb").read())
    os.kill(child_pids(replica)[0], signal.SIGKILL)
    try:
        served.proc.wait(timeout=30)
    finally:
        code, output, leftovers = stop_http(served)
    errors = [line for line in output.splitlines() if "tprun: error:" in line]
    assert code == 1, output
    assert len(errors) == 1 and errors[0].startswith(
        "tprun: error: data-parallel replica 1 (local ranks 2-3) failed: worker rank"), output
    assert "Traceback" not in output, output
    assert leftovers == [] and socket_dirs(sockets) == [], output
    os.rmdir(sockets)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, said", [
    (["--nproc-per-node", "3", "serve", "-dp", "2", "-tp", "2"],
     "--nproc-per-node 3 is not --tensor-parallel-size 2 x --data-parallel-size 2 = 4"),
    (["--nproc-per-node", "3", "serve", "-dp", "2"],
     "--nproc-per-node 3 is not a multiple of --data-parallel-size 2"),
])
def test_a_world_size_other_than_tp_times_dp_is_refused(tmp_path, argv, said):
    sockets = tempfile.mkdtemp(prefix="dp")
    result, leftovers = run_tprun([*argv, "--model", "tiny", "--device", "cpu",
                                   "--http-port", "0"], timeout=60, env={"TMPDIR": sockets})
    _assert_refused_before_start(result, leftovers, said, sockets)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)])
def test_a_stop_ends_every_replicas_streams_with_the_engines_stop(tmp_path, sig, to_group):
    """A stream on each replica, then SIGTERM to the serving process alone
    (a job's stop), or a terminal's Ctrl-C (SIGINT to the whole group,
    which the replicas do not take themselves): both streams end with the
    error event of an engine that stopped, then [DONE], as without -dp;
    the server exits 0 with its one stop line and no traceback."""
    sockets = tempfile.mkdtemp(prefix="dp")
    served = start_http(tmp_path, "serve", "-dp", "2", "--model", "tiny", "--device", "cpu",
                        "--disable-log-stats", env={"TMPDIR": sockets}, timeout_s=180)
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 3000, "ignore_eos": True,
            "temperature": 0.0, "stream": True}
    with httpx.Client(timeout=60) as http, contextlib.ExitStack() as streams:
        lines = []
        for _ in range(2):  # the first on replica 0, so the second on replica 1
            response = streams.enter_context(http.stream("POST", f"{served.url}/v1/completions",
                                                         json=body))
            assert response.status_code == 200
            lines.append(response.iter_lines())
            assert next(lines[-1]).startswith("data: {")
        assert per_engine(served.url, "tprun:num_requests_running") == {"0": 1.0, "1": 1.0}
        (os.killpg if to_group else os.kill)(served.proc.pid, sig)
        endings = [[line for line in rest if line][-2:] for rest in lines]
    try:
        served.proc.wait(timeout=60)
    finally:
        code, output, leftovers = stop_http(served)
    for ending in endings:
        assert ending[0].startswith('data: {"error": {"message": "the engine stopped'), ending
        assert ending[1] == "data: [DONE]"
    assert code == 0 and "Traceback" not in output, output
    assert output.splitlines()[-1] == f"tprun serve: stopped by {signal.Signals(sig).name}"
    assert leftovers == [] and socket_dirs(sockets) == [], output
    os.rmdir(sockets)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["port above 65535", "port busy", "attached workers"])
def test_what_a_replica_could_not_start_with_is_refused_before_anything_starts(tmp_path, case):
    """Replica d listens on --master-port + d: one above 65535, or busy,
    is the user's error (exit code 2, one line naming the replica) before
    any replica loads, not a replica's failure after replica 0 has loaded;
    --attach-workers names one engine's worker sockets, which two replicas
    cannot both bind."""
    sockets = tempfile.mkdtemp(prefix="dp")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv, said = {
            "port above 65535": (["--master-port", "65535", "serve", "-tp", "2"],
                                 "--master-port 65535 gives data-parallel replica 1 port 65536"),
            "port busy": (["--master-port", str(port - 1), "serve", "-tp", "2"],
                          f"data-parallel replica 1 (--master-port {port - 1} + 1): "
                          f"master_port {port}: cannot listen"),
            "attached workers": (["serve", "--attach-workers", str(tmp_path / "workers")],
                                 "--attach-workers serves one engine's workers"),
        }[case]
        result, leftovers = run_tprun([*argv, "-dp", "2", "--model", "tiny", "--device", "cpu",
                                       "--http-port", "0"], timeout=90, env={"TMPDIR": sockets})
    _assert_refused_before_start(result, leftovers, said, sockets)


@pytest.mark.timeout(240)
def test_a_replica_stopped_alone_ends_the_server_saying_how(tmp_path):
    """SIGTERM to replica 1's process alone (its clean stop, exit code 0):
    the server ends, one error line naming the replica and its stop."""
    sockets = tempfile.mkdtemp(prefix="dp")
    served = start_http(tmp_path, "serve", "-dp", "2", "--model", "tiny", "--device", "cpu",
                        "--disable-log-stats", env={"TMPDIR": sockets}, timeout_s=180)
    replica = next(pid for pid in child_pids(served.proc.pid)
                   if b"launch.replica" in open(f"/proc/{pid}/cmdline", "rb").read())
    os.kill(replica, signal.SIGTERM)
    try:
        served.proc.wait(timeout=60)
    finally:
        code, output, leftovers = stop_http(served)
    errors = [line for line in output.splitlines() if "tprun: error:" in line]
    assert code == 1, output
    assert errors == ["tprun: error: data-parallel replica 1 (local rank 1) failed: "
                      "stopped by SIGTERM"], output
    assert leftovers == [] and socket_dirs(sockets) == [], output
    os.rmdir(sockets)


def _assert_refused_before_start(result, leftovers, said: str, sockets: str) -> None:
    """One ``tprun: error:`` line saying ``said``, exit code 2, nothing on
    stdout and nothing left: no process, no socket directory in ``sockets``
    (which is then removed)."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"tprun: error: {result.stderr[14:].strip()}"]
    assert said in result.stderr
    assert result.stdout == "" and leftovers == [] and socket_dirs(sockets) == []
    os.rmdir(sockets)
