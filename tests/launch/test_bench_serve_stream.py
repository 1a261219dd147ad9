"""``tprun bench serve`` against a stand-in server whose bytes and
pauses the test writes (``tests.helpers.sse_stand_in``)."""

from __future__ import annotations

import json

import pytest

from checkpoint.tiny_model import ensure_tiny_model
from launch.cli import main
from tests.helpers.sse_stand_in import StandIn, event, running, token, usage


def _bench(url: str, tmp_path, *args: str) -> tuple[int, dict | None]:
    result = tmp_path / "result.json"
    code = main(["bench", "serve", "--base-url", url, "--model", "m", "--tokenizer",
                 ensure_tiny_model(), "--random-input-len", "8", "--random-output-len", "3",
                 "--disable-tqdm", "--save-result", "--save-detailed", "--result-filename",
                 str(result), *args])
    return code, (json.loads(result.read_text()) if result.exists() else None)


def _three_tokens(i, body):
    return [(event(token("x")), 0.0)] * 3 + [(event(usage(8, 3)) + event("[DONE]"), 0.0)]



@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", [("--request-rate", "0"), ("--burstiness", "0"),
                                    ("--request-rate", "-2")])
def test_a_bad_rate_is_refused_before_any_request(tmp_path, capsys, option):
    stand_in = StandIn(_three_tokens)
    with running(stand_in) as url:
        code, saved = _bench(url, tmp_path, "--num-prompts", "2", "--num-warmups", "2",
                             "--request-rate", "4", *option)
    assert code == 2 and saved is None and stand_in.requests == []
    assert option[0] in capsys.readouterr().err
