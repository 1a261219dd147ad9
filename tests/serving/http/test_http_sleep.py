"""vLLM's dev routes of sleep mode over HTTP (``TPRUN_SERVER_DEV_MODE=1``, or
vLLM's ``VLLM_SERVER_DEV_MODE=1``): /sleep, /is_sleeping, /wake_up and
/reset_prefix_cache on a served ``tiny`` with ``--enable-sleep-mode``; a
completion after waking equals the one before, and one sent while asleep
waits and then gets the same tokens. Without dev mode the routes are 404."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.helpers.http_utils import openai_client, recording_app, serving_tiny

PROMPT = [5, 17, 99, 3, 42]


def _tokens(client) -> list[int]:
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    return answer.choices[0].token_ids


def _is_sleeping(url: str) -> dict:
    answer = httpx.get(f"{url}/is_sleeping", timeout=30)
    assert answer.status_code == 200
    return answer.json()


@pytest.mark.timeout(300)
def test_sleep_wake_up_round_trip(tmp_path):
    with serving_tiny(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats", "--enable-sleep-mode",
                      env={"TPRUN_SERVER_DEV_MODE": "1"}) as server, \
            openai_client(server) as client:
        url = server.url
        before = _tokens(client)
        assert len(before) == 8
        assert _is_sleeping(url) == {"is_sleeping": False}

        answer = httpx.post(f"{url}/sleep", params={"level": "1"}, timeout=60)
        assert (answer.status_code, answer.content) == (200, b"")
        assert _is_sleeping(url) == {"is_sleeping": True}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_tokens, client)  # queued until the engine wakes
            with pytest.raises(concurrent.futures.TimeoutError):
                waiting.result(timeout=1.0)
            answer = httpx.post(f"{url}/wake_up", timeout=60)
            assert (answer.status_code, answer.content) == (200, b"")
            assert waiting.result(timeout=60) == before
        assert _is_sleeping(url) == {"is_sleeping": False}
        assert _tokens(client) == before

        # Level 2, woken tag by tag (vLLM's repeated ?tags=).
        assert httpx.post(f"{url}/sleep", params={"level": "2"}, timeout=60).status_code == 200
        answer = httpx.post(f"{url}/wake_up", params={"tags": "weights"}, timeout=60)
        assert answer.status_code == 200
        assert _is_sleeping(url) == {"is_sleeping": True}
        answer = httpx.post(f"{url}/wake_up", params=[("tags", "kv_cache")], timeout=60)
        assert answer.status_code == 200
        assert _is_sleeping(url) == {"is_sleeping": False}
        assert _tokens(client) == before

        answer = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
        assert (answer.status_code, answer.content) == (200, b"")
        answer = httpx.post(f"{url}/wake_up", params={"tags": "scheduling"}, timeout=30)
        assert answer.status_code == 500
        assert "unknown wake_up tags ['scheduling']" in answer.json()["error"]["message"]
        assert _tokens(client) == before


@pytest.mark.timeout(300)
def test_sleep_without_sleep_mode_fails_with_vllms_message(tmp_path):
    with serving_tiny(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      env={"VLLM_SERVER_DEV_MODE": "1"}) as server, \
            openai_client(server) as client:
        before = _tokens(client)
        answer = httpx.post(f"{server.url}/sleep", timeout=60)
        assert answer.status_code == 500
        assert answer.json()["error"]["message"] == "Sleep mode is not enabled in the model config"
        assert _is_sleeping(server.url) == {"is_sleeping": False}
        assert _tokens(client) == before


def test_without_dev_mode_the_routes_are_404(tiny_dir):
    with recording_app(tiny_dir) as app:
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
                             ("POST", "/reset_prefix_cache")):
            assert app.http.request(method, path).status_code == 404, path
