"""vLLM's run-batch options besides the files: ``--output-tmp-dir`` (the
output written in that directory, moved into place when the batch ends
well), ``--enable-metrics`` with ``--url`` / ``--port`` (the batch app's
own /metrics page, and no other route, while the batch runs), and the
options that change nothing here, taken as vLLM's command lines give
them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from launch.batch_job import BatchFiles
from serving.http.metrics_server import serving_metrics
from tests.helpers.proc_utils import ROOT, pythonpath, reap_session


def _staged(tmp_dir) -> list[str]:
    return [n for n in os.listdir(tmp_dir) if n.startswith("tmp_batch_output_")]


def test_output_tmp_dir_moves_the_whole_output_into_place_at_the_end(tmp_path):
    (tmp_path / "in.jsonl").write_text("x\n")
    staging, output = tmp_path / "staging", tmp_path / "out.jsonl"
    staging.mkdir()
    output.write_text("older output\n")
    files = BatchFiles(str(tmp_path / "in.jsonl"), str(output), str(staging))
    files.check()
    with files.opened() as (_, sink):
        sink.write("line 1\n")
        sink.flush()
        assert output.read_text() == "older output\n"  # untouched while the batch runs
        assert [(staging / n).read_text() for n in _staged(staging)] == ["line 1\n"]
    assert output.read_text() == "line 1\n" and _staged(staging) == []
    plain = tmp_path / "plain.jsonl"
    with open(plain, "w"):
        pass
    assert os.stat(output).st_mode == os.stat(plain).st_mode  # as open() makes a file


def test_output_tmp_dir_keeps_the_lines_of_a_batch_that_ends_early(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text("x\n")
    output = tmp_path / "out.jsonl"
    output.write_text("older output\n")
    files = BatchFiles(str(tmp_path / "in.jsonl"), str(output), str(tmp_path))
    with pytest.raises(RuntimeError, match="the engine stopped"):
        with files.opened() as (_, sink):
            sink.write("line 1\n")
            raise RuntimeError("the engine stopped")
    assert output.read_text() == "older output\n"
    [name] = _staged(tmp_path)
    assert (tmp_path / name).read_text() == "line 1\n"
    assert capsys.readouterr().err == (f"tprun run-batch: the lines written are in "
                                       f"{tmp_path / name}\n")


@pytest.mark.parametrize("output, tmp_dir, message", [
    ("-", "{dir}", "--output-tmp-dir holds the output file until the batch ends: give "
                   "--output-file FILE, not -"),
    ("{dir}/out.jsonl", "{dir}/missing", "--output-tmp-dir {dir}/missing is not a directory"),
])
def test_output_tmp_dir_errors(tmp_path, output, tmp_dir, message):
    (tmp_path / "in.jsonl").write_text("x\n")
    files = BatchFiles(str(tmp_path / "in.jsonl"), output.format(dir=tmp_path),
                       tmp_dir.format(dir=tmp_path))
    with pytest.raises(ValueError, match=f"^{re.escape(message.format(dir=tmp_path))}$"):
        files.check()


def test_metrics_server_serves_the_apps_metrics_page_and_no_other_route():
    async def page(_request):
        return PlainTextResponse("tprun:example_total 3.0\n")

    async def completion(_request):
        return PlainTextResponse("an answer")

    app = Starlette(routes=[Route("/metrics", page),
                            Route("/v1/completions", completion, methods=["POST"])])

    async def scrape() -> tuple:
        async with serving_metrics(app, "127.0.0.1", 0) as port:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                metrics = await client.get("/metrics")
                other = await client.post("/v1/completions", json={})
        with pytest.raises(httpx.ConnectError):  # stopped after the block
            httpx.get(f"http://127.0.0.1:{port}/metrics")
        return metrics, other

    metrics, other = asyncio.run(scrape())
    assert (metrics.status_code, metrics.text) == (200, "tprun:example_total 3.0\n")
    assert other.status_code == 404
    assert other.json()["error"]["message"] == "this server serves GET /metrics only"


def test_a_busy_metrics_port_is_one_error_line_before_anything_starts(tmp_path, capsys,
                                                                      monkeypatch):
    from launch.cli import main

    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "in.jsonl").write_text("\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", "-", "--model",
                     "tiny", "--device", "cpu", "--enable-metrics", "--port", str(port)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tprun: error: --port {port}: cannot listen on 127.0.0.1:{port}")
    assert not (tmp_path / "cache").exists()  # the model was never written, nor loaded


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@pytest.mark.timeout(200)
def test_enable_metrics_serves_the_batchs_metrics_while_it_runs(tmp_path):
    """The batch reads a pipe held open: after its first answer the page
    counts that request (the app's own histograms and the engine's token
    counters); the page goes once the input ends and the batch with it."""
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "run-batch", "-i", "-", "-o", "-", "--model", "tiny",
         "--device", "cpu", "--enable-metrics", "--port", "0"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stderr:
            if found := re.search(r"Prometheus metrics at (http://127\.0\.0\.1:\d+/metrics)",
                                  line):
                break
        else:
            pytest.fail("no metrics line: " + proc.communicate()[1])
        url = found.group(1)
        assert _metric(httpx.get(url).text, "tprun:request_success_total") == 0
        proc.stdin.write(json.dumps({"custom_id": "a", "method": "POST",
                                     "url": "/v1/completions", "body": body}) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        page = httpx.get(url).text
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        leftovers = reap_session(proc.pid, grace_s=5)
    assert proc.returncode == 0 and leftovers == []
    usage = answer["response"]["body"]["usage"]
    assert _metric(page, "tprun:request_success_total") == 1
    assert _metric(page, "tprun:time_to_first_token_seconds_count") == 1
    assert _metric(page, "tprun:prompt_tokens_total") == usage["prompt_tokens"]
    assert _metric(page, "tprun:generation_tokens_total") == usage["completion_tokens"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)
