"""``tprun run-batch`` with http(s) URLs for its files, as vLLM's run-batch
takes them: the input read with a GET, the output sent whole with a PUT,
from a local HTTP server (``http.server`` on 127.0.0.1, in a thread).
Answers are checked against a run of the same file with ``-i FILE -o
FILE``; a URL that cannot be read is one ``tprun: error:`` line before the
model loads; a PUT that keeps failing exits 1 and names the file that
holds the lines; schemes other than http and https are refused up front;
the upload's retries and the query hidden from messages in
``batch_urls`` itself."""

from __future__ import annotations

import http.server
import json
import os
import re
import tempfile
import threading

import pytest

from launch import batch_urls
from launch.batch_job import BatchFiles
from tests.helpers.batch_files import answer, run_batch
from tests.helpers.proc_utils import child_pids, run_tprun

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
        "temperature": 0}
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 7, "temperature": 0}
LINES = [("chat", "/v1/chat/completions", CHAT),
         ("completion", "/v1/completions", COMPLETION),
         ("chat-2", "/v1/chat/completions", {**CHAT, "max_tokens": 3}),
         ("refused", "/v1/completions", {"prompt": "Hi", "max_tokens": -1})]
# A presigned URL's query is its credential: no message shows it.
SIGNATURE = "X-Amz-Signature=0123456789abcdef"


class FileServer(http.server.ThreadingHTTPServer):
    """GET of a path in ``files`` answers its bytes (404 else); a PUT is
    recorded in ``puts`` (path, headers, body) and answered with the next
    of ``put_statuses`` (its last one once they run out)."""

    def __init__(self, files: dict[str, bytes], put_statuses=(200,)):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files, self.put_statuses = files, list(put_statuses)
        self.puts: list[tuple[str, dict, bytes]] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_port}{path}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FileServer

    def do_GET(self):
        body = self.server.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        body = body if body is not None else b"no such file"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.puts.append((self.path, dict(self.headers), body))
        statuses = self.server.put_statuses
        self.send_response(statuses.pop(0) if len(statuses) > 1 else statuses[0])
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _outputs(text: str) -> dict:
    return {o["custom_id"]: o for o in map(json.loads, text.splitlines())}


def _assert_same_answers(outputs: dict, reference: dict) -> None:
    """The outputs of the same lines as ``reference``'s (the ``-o FILE`` run),
    each the same answer (greedy: the same text) or the same refusal."""
    assert list(outputs) == list(reference)
    for custom_id, expected in reference.items():
        got = outputs[custom_id]
        assert got["response"]["status_code"] == expected["response"]["status_code"]
        if expected["error"] is not None:
            assert got["error"] == expected["error"]
            continue
        body, wanted = answer(got), answer(expected)
        texts = [c.get("text", c.get("message", {}).get("content")) for c in body["choices"]]
        assert texts == [c.get("text", c.get("message", {}).get("content"))
                         for c in wanted["choices"]]
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached ones vary
        assert [body["usage"][k] for k in counts] == [wanted["usage"][k] for k in counts]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(the folder, its in.jsonl's bytes, the output lines of ``-i FILE -o
    FILE``); the model cache in ``folder/cache``, shared by the module's
    runs."""
    folder = tmp_path_factory.mktemp("run-batch-urls")
    result, outputs = run_batch(folder, "tiny", LINES)
    assert result.returncode == 0, result.stderr
    assert outputs["refused"]["response"]["status_code"] == 400
    return folder, (folder / "in.jsonl").read_bytes(), outputs


def _run(folder, *args: str):
    result, leftovers = run_tprun(["run-batch", *args, "--model", "tiny", "--device", "cpu",
                                   "--block-size", "16"],
                                  timeout=150, env={"TPRUN_CACHE": str(folder / "cache")})
    assert leftovers == [], result.stderr
    return result


@pytest.mark.timeout(400)
def test_input_and_output_urls_give_the_answers_of_files(reference):
    folder, source, expected = reference
    staging = folder / "staging-ok"
    staging.mkdir()
    with FileServer({f"/in.jsonl?{SIGNATURE}": source}) as server:
        result = _run(folder, "-i", server.url(f"/in.jsonl?{SIGNATURE}"),
                      "-o", server.url(f"/out.jsonl?{SIGNATURE}"), "--output-tmp-dir",
                      str(staging))
    assert result.returncode == 0, result.stderr
    [(path, headers, body)] = server.puts
    assert path == f"/out.jsonl?{SIGNATURE}"
    assert headers["Content-Type"] == "application/octet-stream"
    assert int(headers["Content-Length"]) == len(body)
    _assert_same_answers(_outputs(body.decode("utf-8")), expected)
    assert os.listdir(staging) == []  # the uploaded file removed
    assert f"4 lines uploaded to {server.url('/out.jsonl')}?..." in result.stderr
    assert "0123456789abcdef" not in result.stderr


@pytest.mark.timeout(400)
def test_a_put_that_keeps_failing_exits_1_and_names_the_file_holding_the_lines(reference):
    folder, source, expected = reference
    with FileServer({}, put_statuses=(500,)) as server:
        result = _run(folder, "-i", str(folder / "in.jsonl"),
                      "-o", server.url(f"/out.jsonl?{SIGNATURE}"))
    assert result.returncode == 1, result.stderr
    assert len(server.puts) == batch_urls.UPLOAD_ATTEMPTS  # vLLM's 5 tries
    assert all(body == server.puts[0][2] for _, _, body in server.puts)
    *lines, last = result.stderr.strip().splitlines()
    retries = [line for line in lines if "the upload to" in line]
    assert retries == [f"tprun run-batch: the upload to {server.url('/out.jsonl')}?... failed "
                       f"(HTTP 500 Internal Server Error), try {n} of 5; again in 5 s"
                       for n in range(1, 5)]
    match = re.fullmatch(
        re.escape(f"tprun: error: --output-file {server.url('/out.jsonl')}?...: the upload "
                  "failed (HTTP 500 Internal Server Error (5 tries)); the output lines are in ")
        + "(.+)", last)
    assert match, last
    kept = match.group(1)
    try:
        assert os.path.basename(kept).startswith("tmp_batch_output_")
        with open(kept, "rb") as f:
            text = f.read()
        assert text == server.puts[0][2]  # what each PUT sent
        _assert_same_answers(_outputs(text.decode("utf-8")), expected)
    finally:
        os.remove(kept)
    assert "0123456789abcdef" not in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/missing.jsonl", "/missing.jsonl?" + SIGNATURE])
def test_an_input_url_that_cannot_be_read_is_one_line_before_the_model_loads(
        tmp_path, capsys, monkeypatch, path):
    from launch.cli import main

    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "cache"))
    with FileServer({}) as server:
        code = main(["run-batch", "-i", server.url(path), "-o", str(tmp_path / "out.jsonl"),
                     "--model", "tiny", "--device", "cpu"])
    assert code == 2
    shown = server.url("/missing.jsonl") + ("?..." if "?" in path else "")
    assert capsys.readouterr().err.splitlines() == [
        f"tprun: error: --input-file {shown}: HTTP 404 Not Found"]
    assert not (tmp_path / "cache").exists()  # the model was never written, nor loaded
    assert not (tmp_path / "out.jsonl").exists()
    assert child_pids(os.getpid()) == []


@pytest.mark.timeout(60)
def test_an_input_url_nobody_answers_is_one_line(tmp_path, capsys, monkeypatch):
    from launch.cli import main

    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "cache"))
    with FileServer({}) as server:
        url = server.url("/in.jsonl")
    code = main(["run-batch", "-i", url, "-o", "-", "--model", "tiny", "--device", "cpu"])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tprun: error: --input-file {url}: Cannot connect to host "
                           f"127.0.0.1:{server.server_port}")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("option, name, message", [
    ("-i", "s3://bucket/in.jsonl", "--input-file s3://bucket/in.jsonl: s3:// is not read or "
                                   "written: only http:// and https:// URLs are"),
    ("-o", "ftp://host/out.jsonl", "--output-file ftp://host/out.jsonl: ftp:// is not read or "
                                   "written: only http:// and https:// URLs are"),
    ("-i", "file:///tmp/in.jsonl", "--input-file file:///tmp/in.jsonl: file:// is not read or "
                                   "written: only http:// and https:// URLs are"),
    ("-o", "https:///out.jsonl", "--output-file https:///out.jsonl: no host"),
    ("-o", "http://127.0.0.1:abc/out.jsonl", "--output-file http://127.0.0.1:abc/out.jsonl: "
                                             "not a URL (Port could not be cast to integer "
                                             "value as 'abc')"),
    ("-o", "http://127.0.0.1:99999/out.jsonl", "--output-file http://127.0.0.1:99999/out.jsonl:"
                                               " not a URL (Port out of range 0-65535)"),
])
def test_other_schemes_are_refused_before_anything_starts(tmp_path, capsys, monkeypatch,
                                                          option, name, message):
    from launch.cli import main

    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "in.jsonl").write_text("\n")
    files = {"-i": str(tmp_path / "in.jsonl"), "-o": str(tmp_path / "out.jsonl"), option: name}
    code = main(["run-batch", "-i", files["-i"], "-o", files["-o"], "--model", "tiny",
                 "--device", "cpu"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [f"tprun: error: {message}"]
    assert not (tmp_path / "cache").exists()


def test_an_output_url_takes_no_local_checks_and_stages_in_the_temporary_directory(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"line\n")
    files = BatchFiles(str(tmp_path / "in.jsonl"), "https://example.com/out.jsonl")
    files.check()
    local = files.local()
    assert local.input_copy is None
    assert os.path.dirname(local.output_copy) == tempfile.gettempdir()
    assert os.path.basename(local.output_copy).startswith("tmp_batch_output_")
    assert not os.path.exists(local.output_copy)  # made when the batch opens it


def test_the_input_copy_is_the_get_body_byte_for_byte(tmp_path):
    body = b'{"a": 1}\n\n\xff not utf-8\n' + b"x" * 200_000 + b"\n"
    with FileServer({"/in.jsonl": body}) as server:
        files = BatchFiles(server.url("/in.jsonl"), str(tmp_path / "out.jsonl"))
        files.check()
        local = files.local()
    try:
        assert local.count_lines() == 3
        with local.opened() as (source, _sink):
            assert source.read() == body
    finally:
        local.close()


def test_the_upload_tries_again_after_5xx_and_takes_any_2xx(tmp_path, capsys):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"x": 1}\n')
    with FileServer({}, put_statuses=(503, 500, 201)) as server:
        batch_urls.upload(server.url("/out.jsonl"), str(path), retry_s=0)
    assert [body for _, _, body in server.puts] == [b'{"x": 1}\n'] * 3
    assert len(capsys.readouterr().err.splitlines()) == 2  # a line for each failed try


def test_a_refused_put_is_not_tried_again(tmp_path, capsys):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"")
    with FileServer({}, put_statuses=(403,)) as server:
        with pytest.raises(batch_urls.TransferError, match=r"^HTTP 403 Forbidden$"):
            batch_urls.upload(server.url("/out.jsonl"), str(path), retry_s=0)
    assert len(server.puts) == 1 and server.puts[0][2] == b""
    assert capsys.readouterr().err == ""


def test_a_failed_upload_keeps_the_file_and_names_it(tmp_path):
    staged = tmp_path / "tmp_batch_output_x.jsonl"
    staged.write_bytes(b"lines\n")
    with FileServer({}, put_statuses=(404,)) as server:
        files = BatchFiles("-", server.url("/out.jsonl?sig=secret"), output_copy=str(staged))
        with pytest.raises(OSError) as failure:
            files.upload()
    assert str(failure.value) == (f"--output-file {server.url('/out.jsonl')}?...: the upload "
                                  f"failed (HTTP 404 Not Found); the output lines are in {staged}")
    assert staged.read_bytes() == b"lines\n"


@pytest.mark.parametrize("url, shown", [
    ("https://user:pw@bucket.example.com/a/b.jsonl?X-Amz-Signature=s#frag",
     "https://bucket.example.com/a/b.jsonl?..."),
    ("http://127.0.0.1:8000/out.jsonl", "http://127.0.0.1:8000/out.jsonl"),
])
def test_messages_show_a_url_without_its_credentials(url, shown):
    assert batch_urls.shown(url) == shown


def test_names_with_a_scheme_are_urls_and_others_are_paths():
    assert batch_urls.is_url("HTTPS://example.com/x") and batch_urls.is_url("s3://b/k")
    assert batch_urls.url_error("HTTPS://example.com/x") is None
    assert not batch_urls.is_url("out.jsonl") and not batch_urls.is_url("-")
    assert not batch_urls.is_url("dir/http://x")  # a path with a colon in it


def test_a_put_redirected_to_a_url_aiohttp_cannot_request_is_not_tried_again(tmp_path, capsys):
    """A redirect to a bad URL stays bad: one try, as a refused PUT gets
    (only a failed connection, a timeout, 408, 429 and 5xx are tried again)."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            self.server.puts += 1
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.1:abc/out.jsonl")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    path = tmp_path / "out.jsonl"
    path.write_bytes(b"x\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    server.puts = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(batch_urls.TransferError, match=r"^not a URL aiohttp can request$"):
            batch_urls.upload(f"http://127.0.0.1:{server.server_port}/out.jsonl", str(path),
                              retry_s=0)
    finally:
        server.shutdown()
        server.server_close()
    assert server.puts == 1
    assert capsys.readouterr().err == ""
