"""Where an output begins under a reasoning parser is the engine's one
decision (``Reasoning.starts_inside``), for every caller: an
``EngineClient`` over the engine endpoint and ``LLM.chat`` in process get
the rule the HTTP server gets, from the prompt and the request's
``enable_thinking``, without working it out themselves.

On ``tiny`` with ``<think>``/``</think>`` (``tests.helpers.think_model``)
under ``qwen3``: a prompt that opens the thinking (``open_think``, as
DeepSeek-R1's template does) begins inside it, unless ``enable_thinking``
is false (qwen3's switch). A regex constraint shows which: it holds from
the first token of an output that begins after its reasoning (greedy: the
whole text matches), and waits for ``</think>`` in one that begins inside
(greedy ``tiny`` writes free bytes, which the regex would never allow)."""

from __future__ import annotations

import contextlib
import re
import threading

import pytest

from engine import LLM, SamplingParams
from ipc.auth import new_secret
from serving.client import EngineClient
from serving.endpoint import Endpoint, EngineServer
from tests.helpers.think_model import THINK, tiny_with_think_tokens

pytestmark = pytest.mark.timeout(300)

REGEX = "[0-9]{3}"
GREEDY = {"temperature": 0.0, "max_tokens": 8, "structured_outputs": {"regex": REGEX}}
OPEN_PROMPT = {"prompt_token_ids": [256, 72, 105, THINK]}  # ends inside an open thinking


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("think")
    model = tiny_with_think_tokens(str(root / "cache"), str(root / "model"))
    with LLM(model=model, device="cpu", executor="uni", max_model_len=256,
             reasoning_parser="qwen3") as llm:
        yield llm


@contextlib.contextmanager
def served(llm: LLM):
    """``llm``'s engine behind an endpoint, its loop in a thread; yields a
    connected ``EngineClient``."""
    secret = new_secret()
    server = EngineServer(llm.engine, Endpoint.create(), secret=secret)
    loop = threading.Thread(target=server.serve, name="engine-loop")
    loop.start()
    try:
        with EngineClient(server.address, timeout_s=120, secret=secret) as client:
            yield client
    finally:
        server.stop()
        loop.join(timeout=60)
        server.close()


def _text(client: EngineClient, request_id: str) -> str:
    return "".join(delta.text for delta in client.stream(request_id))


def test_an_engine_client_gets_the_engines_rule(llm):
    with served(llm) as client:
        off = client.submit(OPEN_PROMPT, GREEDY, enable_thinking=False)
        on = client.submit(OPEN_PROMPT, GREEDY)
        assert client.starts_in_reasoning(off) is False
        assert client.starts_in_reasoning(on) is True
        assert re.fullmatch(REGEX, _text(client, off))
        assert not re.fullmatch(REGEX, _text(client, on))


def test_llm_chat_tells_the_engine_its_enable_thinking(llm):
    """The template opens the thinking whatever ``enable_thinking`` says;
    qwen3's switch, read by the engine, makes the output begin after it."""
    messages = [{"role": "user", "content": "Pick a number."}]
    params = SamplingParams(**GREEDY)
    off, = llm.chat(messages, params, chat_template_kwargs={"open_think": True,
                                                            "enable_thinking": False})
    on, = llm.chat(messages, params, chat_template_kwargs={"open_think": True})
    assert off.prompt.endswith("<think>\n") and on.prompt.endswith("<think>\n")
    assert re.fullmatch(REGEX, off.outputs[0].text)
    assert not re.fullmatch(REGEX, on.outputs[0].text)
