"""vLLM's ``--response-role`` (``create_app(response_role=...)``) through the
official ``openai`` client on the app in process: after a generation prompt
a chat answer, whole or streamed, has that role; without one it continues
the last message in its role, whatever the option; ``echo`` repeats the
last message when it has the answer's role."""

from __future__ import annotations

import pytest

from tests.helpers.http_utils import recording_app

pytestmark = pytest.mark.timeout(60)

ASKED = [{"role": "user", "content": "Hi"}]
BEGUN = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Hello"}]


@pytest.fixture(scope="module")
def app(model_dir):
    with recording_app(model_dir, response_role="bot") as app:
        yield app


def test_the_answer_after_a_generation_prompt_has_the_response_role(app):
    whole = app.client.chat.completions.create(model="tiny", messages=ASKED)
    assert whole.choices[0].message.role == "bot"
    stream = app.client.chat.completions.create(model="tiny", messages=ASKED, stream=True)
    assert next(iter(stream)).choices[0].delta.role == "bot"


def test_without_a_generation_prompt_the_last_message_keeps_its_role(app):
    whole = app.client.chat.completions.create(
        model="tiny", messages=ASKED, extra_body={"add_generation_prompt": False})
    assert whole.choices[0].message.role == "user"


@pytest.mark.parametrize("role, content", [("system", "Hello" + "hi"), ("assistant", "hi")])
def test_echo_repeats_a_last_message_of_the_response_role(model_dir, role, content):
    """The echo, then the answer ("hi", the recording link's)."""
    with recording_app(model_dir, response_role=role) as app:
        whole = app.client.chat.completions.create(model="tiny", messages=BEGUN,
                                                   extra_body={"echo": True})
    assert whole.choices[0].message.role == role
    assert whole.choices[0].message.content == content


def test_the_default_role_is_the_assistants(model_dir):
    with recording_app(model_dir) as app:
        whole = app.client.chat.completions.create(model="tiny", messages=ASKED)
    assert whole.choices[0].message.role == "assistant"
