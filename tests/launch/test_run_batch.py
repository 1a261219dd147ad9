"""``tprun run-batch``: each request of a batch file answered as the HTTP
server answers it (``serve --http-port``, asked with the official
``openai`` client), in the input's order, in vLLM's output line format;
lines that are not batch requests, urls not served and streaming
requests answered with vLLM's error lines while the others run; the
command line's errors one line, exit code 2, before anything starts (an
output file that stdin reads too among them); an input pipe left whole to
the run.

One ``serve`` and one ``run-batch`` of ``tiny`` for the module, shared by
its tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import openai
import pytest

from tests.helpers.batch_files import assert_error_line
from tests.helpers.http_utils import openai_client, start_http, stop_http
from tests.helpers.proc_utils import ROOT, child_pids, pythonpath, reap_session, run_tprun

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 6, "temperature": 0}
CHAT_2 = {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Name a colour"}],
          "max_completion_tokens": 4, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 7,
              "temperature": 0}
NEGATIVE_MAX_TOKENS = {"model": "tiny", "prompt": "Hi", "max_tokens": -1}
UNKNOWN_MODEL = {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}


def _line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


# (custom_id, input line); None: a line that is not a batch request. A blank line between.
LINES = [
    ("chat", _line("chat", "/v1/chat/completions", CHAT)),
    ("completion", _line("completion", "/v1/completions", COMPLETION)),
    ("negative", _line("negative", "/v1/completions", NEGATIVE_MAX_TOKENS)),
    (None, '{"custom_id": "broken", "method": "POST"'),  # JSON cut short
    ("unknown-model", _line("unknown-model", "/v1/chat/completions", UNKNOWN_MODEL)),
    ("no-url", '{"custom_id": "no-url", "method": "POST", "body": {}}'),
    ("embeddings", _line("embeddings", "/v1/embeddings", {"model": "tiny", "input": "x"})),
    ("stream", _line("stream", "/v1/completions", {**COMPLETION, "stream": True})),
    (None, _line("caf\udce9", "/v1/completions", COMPLETION)),  # byte 0xe9: not UTF-8
    ("chat-2", _line("chat-2", "/v1/chat/completions", CHAT_2)),
]

_ID = re.compile(r"tprun-[0-9a-f]{32}")
_REQUEST_ID = re.compile(r"tprun-batch-[0-9a-f]{32}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The module's files; the model cache of both runs in its ``cache``."""
    return tmp_path_factory.mktemp("run-batch")


@pytest.fixture(scope="module")
def batch(folder):
    """(the run's result, its output lines as objects)."""
    source, target = folder / "in.jsonl", folder / "out.jsonl"
    lines = [text for _, text in LINES]
    text = "\n".join(lines[:3] + ["", "   "] + lines[3:]) + "\n"
    source.write_bytes(text.encode("utf-8", "surrogateescape"))
    result, leftovers = run_tprun(["run-batch", "-i", str(source), "-o", str(target),
                                   "--model", "tiny", "--device", "cpu"],
                                  timeout=150, env={"TPRUN_CACHE": str(folder / "cache")})
    assert leftovers == [], result.stderr
    return result, [json.loads(line) for line in target.read_text().splitlines()]


@pytest.fixture(scope="module")
def server(folder):
    served = start_http(folder, "serve", "--model", "tiny", "--device", "cpu",
                        "--disable-log-stats")
    yield served
    code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def _by_id(outputs: list[dict]) -> dict[str, dict]:
    return {o["custom_id"]: o for o in outputs if o["custom_id"] is not None}


def _without_id_and_time(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@pytest.mark.timeout(300)
def test_answers_are_the_http_servers(batch, client):
    """A chat and a completion request's answers (greedy) equal the
    server's for the same bodies, but for their ids and times, whose shape
    is the server's."""
    _, outputs = batch
    answers = _by_id(outputs)
    asked = {"chat": client.chat.completions.with_raw_response.create(**CHAT),
             "chat-2": client.chat.completions.with_raw_response.create(**CHAT_2),
             "completion": client.completions.with_raw_response.create(**COMPLETION)}
    for custom_id, raw in asked.items():
        expected = raw.http_response.json()
        output = answers[custom_id]
        assert output["error"] is None
        assert output["response"]["status_code"] == 200
        body = output["response"]["body"]
        assert _without_id_and_time(body) == _without_id_and_time(expected), custom_id
        prefix = "chatcmpl-" if custom_id.startswith("chat") else "cmpl-"
        assert body["id"].startswith(prefix) and expected["id"].startswith(prefix)
        assert len(body["id"]) == len(expected["id"])
        assert isinstance(body["created"], int)
        assert body["choices"][0]["finish_reason"] == "length"  # the tokens asked for came


@pytest.mark.timeout(300)
def test_one_output_line_per_request_in_the_input_order(batch):
    result, outputs = batch
    assert [o["custom_id"] for o in outputs] == [custom_id for custom_id, _ in LINES]
    for o in outputs:
        assert list(o) == ["id", "custom_id", "response", "error"]
        assert list(o["response"]) == ["status_code", "request_id", "body"]
        assert _ID.fullmatch(o["id"]) and _REQUEST_ID.fullmatch(o["response"]["request_id"])
    assert len({o["id"] for o in outputs}) == len(outputs)
    assert len({o["response"]["request_id"] for o in outputs}) == len(outputs)


@pytest.mark.timeout(300)
def test_refusals_are_the_servers_status_and_error_body(batch, client):
    _, outputs = batch
    answers = _by_id(outputs)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(**NEGATIVE_MAX_TOKENS)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(**UNKNOWN_MODEL)
    for custom_id, refusal in (("negative", bad.value), ("unknown-model", unknown.value)):
        output = answers[custom_id]
        assert output["response"]["status_code"] == refusal.status_code
        assert output["response"]["body"] is None
        assert output["error"] == refusal.response.json()
    assert answers["unknown-model"]["response"]["status_code"] == 404


@pytest.mark.timeout(300)
def test_lines_that_reach_no_route_get_vllms_error_lines_and_the_others_run(batch):
    """vLLM's messages for an url the model does not serve (embeddings of
    a generating model) and a streaming request (status 400, error a
    string); a line that is not a batch
    request (a line that is not UTF-8 too) is answered in its place (vLLM
    stops the run there), the run exits with code 2 naming it, and every
    other line is answered."""
    result, outputs = batch
    broken, no_url, not_utf8 = outputs[3], outputs[5], outputs[8]
    assert broken["custom_id"] is None  # the line gives none that could be read
    assert broken["error"].startswith("line 6 is not a batch request: not valid JSON")
    assert no_url["error"] == "line 8 is not a batch request: the field 'url' is missing"
    assert not_utf8["custom_id"] is None
    assert not_utf8["error"].startswith("line 11 is not a batch request: not valid JSON")
    answers = _by_id(outputs)
    assert_error_line(answers["embeddings"], "The model does not support Embeddings API")
    assert_error_line(answers["stream"], "Request must not be sent in stream mode")
    for o in (broken, no_url, not_utf8):
        assert_error_line(o)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tprun: error: ") and "3 line(s) are not batch requests" in last
    assert "line 6: not valid JSON" in last
    assert "10 lines written" in result.stderr
    assert all(answers[c]["response"]["status_code"] == 200
               for c in ("chat", "completion", "chat-2"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("files, message", [
    (["-i", "{dir}/missing.jsonl", "-o", "{dir}/out.jsonl"],
     "--input-file {dir}/missing.jsonl: No such file or directory"),
    (["-i", "{dir}/in.jsonl", "-o", "{dir}/no-such-dir/out.jsonl"],
     "--output-file {dir}/no-such-dir/out.jsonl: directory {dir}/no-such-dir does not exist"),
    (["-i", "{dir}/in.jsonl", "-o", "{dir}/in.jsonl"],
     "--output-file {dir}/in.jsonl is the input file"),
    (["-i", "{dir}/in.jsonl", "-o", "{dir}"], "--output-file {dir} is a directory"),
])
def test_command_line_errors_are_one_line_before_anything_starts(tmp_path, files, message):
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", COMPLETION) + "\n")
    argv = [arg.format(dir=tmp_path) for arg in files]
    result, leftovers = run_tprun(["run-batch", *argv, "--model", "tiny", "--device", "cpu"],
                                  timeout=100, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tprun: error: {message.format(dir=tmp_path)}")
    assert leftovers == []
    assert not (tmp_path / "cache").exists()  # the model was never written, nor loaded
    assert (tmp_path / "in.jsonl").read_text().startswith('{"custom_id": "a"')


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stop, code, last", [
    ("sigterm", 143, r"tprun: stopped by SIGTERM"),
    # The rank first found gone: the one killed, or the other, whose collective broke.
    ("worker killed", 1, r"tprun: error: worker rank [01] \(pid \d+\) exited with code -?\d+")])
def test_a_run_stopped_midway_keeps_the_lines_written_and_ends_cleanly(tmp_path, stop, code,
                                                                       last):
    """SIGTERM cancels the batch before the engine stops; a worker killed
    stops the engine first, then the batch is cancelled. Either way: the
    exit code and one line, no traceback (no answer's failure left
    unread by a cancelled request), no process left, and the output holds
    the first lines' answers, whole and in order."""
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(
        _line(f"r{i}", "/v1/completions",
              {"prompt": f"Hi {i}", "max_tokens": 300, "ignore_eos": True}) + "\n"
        for i in range(40)))
    env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "--nproc-per-node", "2", "run-batch", "-i", str(source),
         "-o", str(target), "--model", "tiny", "--device", "cpu", "--max-num-seqs", "4"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (target.exists() and target.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.kill(child_pids(proc.pid)[0], signal.SIGKILL)  # a worker daemon
        _, err = proc.communicate(timeout=60)
    finally:
        leftovers = reap_session(proc.pid, grace_s=5)
    assert proc.returncode == code, err
    assert re.fullmatch(last, err.strip().splitlines()[-1]), err
    assert "Traceback" not in err, err
    assert leftovers == []
    written = [json.loads(line) for line in target.read_text().splitlines()]
    assert 1 <= len(written) < 40
    assert [o["custom_id"] for o in written] == [f"r{i}" for i in range(len(written))]
    assert all(o["response"]["status_code"] == 200 for o in written)


def test_an_input_pipe_is_read_once_by_the_run(tmp_path):
    """An input file that is a pipe (``-i <(...)``, ``/dev/stdin``): the
    checks and the progress bar's count leave its lines to the run."""
    from launch.batch_job import BatchFiles

    lines = (_line("a", "/v1/completions", COMPLETION) + "\n\n"
             + _line("b", "/v1/completions", COMPLETION) + "\n").encode()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, lines)
        os.close(write_end)
        files = BatchFiles(f"/proc/self/fd/{read_end}", str(tmp_path / "out.jsonl"))
        files.check()
        assert files.count_lines() is None  # no total: the bar counts what is done
        with files.opened() as (source, _):
            assert source.read() == lines
    finally:
        os.close(read_end)


def test_stdin_read_from_the_output_file_is_refused(tmp_path, monkeypatch):
    """``-i - -o FILE < FILE`` would empty the requests before they are
    read: refused as ``-i FILE -o FILE`` is; another output file is not."""
    from launch.batch_job import BatchFiles

    source = tmp_path / "in.jsonl"
    source.write_text(_line("a", "/v1/completions", COMPLETION) + "\n")
    with open(source) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(ValueError, match=f"^--output-file {source} is the input file"):
            BatchFiles("-", str(source)).check()
        (tmp_path / "out.jsonl").write_text("")
        BatchFiles("-", str(tmp_path / "out.jsonl")).check()
    assert source.read_text().startswith('{"custom_id": "a"')


def test_the_options_reach_the_run(monkeypatch, tmp_path, capsys):
    """The served names, vLLM's --response-role, the chat template given
    inline and the metrics page's address reach the job, read as serve
    reads them, and vLLM's options that change nothing here are taken (in
    process, the job itself replaced: no engine starts)."""
    import launch.batch_job
    from launch.cli import main
    from serving.http.batch_runner import BatchSummary

    seen = {}

    def job(config, files, names, chat_template, response_role, metrics_address,
            lora_modules=()):
        seen.update(model=config.model, files=files, names=names, template=chat_template,
                    role=response_role, metrics=metrics_address)
        return BatchSummary(written=1, answered=1)

    monkeypatch.setattr(launch.batch_job, "run_batch_job", job)
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "in.jsonl").write_text("\n")
    code = main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", "-", "--model", "tiny",
                 "--device", "cpu", "--served-model-name", "a", "b", "--response-role", "bot",
                 "--chat-template", r"{{ messages[0]['content'] }}\n", "--enable-metrics",
                 "--port", "0", "--max-log-len", "100", "--enable-prompt-tokens-details",
                 "--enable-force-include-usage"])
    assert code == 0, capsys.readouterr().err
    assert seen["names"] == ["a", "b"] and seen["role"] == "bot"
    assert seen["metrics"] == ("127.0.0.1", 0)
    assert seen["template"] == "{{ messages[0]['content'] }}\n"  # the escape read, as serve's
    assert (seen["files"].input, seen["files"].output) == (str(tmp_path / "in.jsonl"), "-")
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tprun run-batch: 1 lines written to stdout (1 answered with status 200)")
