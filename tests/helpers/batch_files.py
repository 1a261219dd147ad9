"""``tprun run-batch`` of a batch file written from ``(custom_id, url, body)``
triples, and the checks of its output lines: an answer, a route's refusal
(its OpenAI error body) and vLLM's one-line error."""

from __future__ import annotations

import json

from tests.helpers.proc_utils import run_tprun


def run_batch(folder, model: str, lines, *options: str):
    """``tprun run-batch`` on ``folder/in.jsonl`` holding ``lines``
    (``(custom_id, url, body)``, each body's ``model`` set to ``model``),
    on the cpu with 16-token blocks, ``options`` added; the model cache in
    ``folder/cache``. Asserts that no process is left and that there is one
    output line per input line, in the input's order. Returns (the run's
    result, its output lines by custom_id)."""
    source, target = folder / "in.jsonl", folder / "out.jsonl"
    source.write_text("".join(
        json.dumps({"custom_id": c, "method": "POST", "url": url,
                    "body": {"model": model, **body}}) + "\n" for c, url, body in lines))
    result, leftovers = run_tprun(["run-batch", "-i", str(source), "-o", str(target),
                                   "--model", model, "--device", "cpu", "--block-size", "16",
                                   *options],
                                  timeout=150, env={"TPRUN_CACHE": str(folder / "cache")})
    assert leftovers == [], result.stderr
    outputs = [json.loads(line) for line in target.read_text().splitlines()]
    assert [o["custom_id"] for o in outputs] == [c for c, _, _ in lines]
    return result, {o["custom_id"]: o for o in outputs}


def answer(output: dict) -> dict:
    """The body of an answered output line: no error, status 200."""
    assert output["error"] is None, output["error"]
    assert output["response"]["status_code"] == 200
    return output["response"]["body"]


def assert_refused(output: dict, param: str | None = None) -> None:
    """An output line that is a route's refusal: status 400, no body, the
    error its OpenAI error body of type ``invalid_request_error`` (naming
    ``param`` when given)."""
    assert output["response"]["status_code"] == 400, output
    assert output["response"]["body"] is None
    assert output["error"]["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert output["error"]["error"]["param"] == param


def assert_error_line(output: dict, message: str | None = None) -> None:
    """An output line with vLLM's one-line error (a line no route answers:
    an API the model does not support, an url not served, a line that is
    not a batch request): status 400, no body, the error a string, equal to
    ``message`` when given."""
    assert output["response"]["status_code"] == 400, output
    assert output["response"]["body"] is None
    assert isinstance(output["error"], str), output["error"]
    if message is not None:
        assert output["error"] == message
