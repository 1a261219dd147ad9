"""A request's own chat template (vLLM's ``chat_template``, or the
``chat_template`` of ``chat_template_kwargs``), through the official
``openai`` client: served by a server that trusts it (vLLM's
``--trust-request-chat-template``), where the prompt the engine gets is
the hand-rendered text of the template over the messages, tokenized by
the tokenizer's own encode; refused with vLLM's message by one that does
not; a template that does not compile or fails on the messages is a 400
and the server goes on serving. The chat route, ``/tokenize``'s chat form
and the Responses API's ``chat_template_kwargs`` alike. In process (over
a link that answers at once and records each prompt), and once through
``tprun serve --trust-request-chat-template --chat-template``. A server's
own template (vLLM's ``--chat-template``) goes before the kwargs' key, as
vLLM's renderer resolves it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers.http_utils import openai_client, recording_app, serving_tiny

# vLLM's refusal, word for word.
UNTRUSTED = ("Chat template is passed with request, but --trust-request-chat-template is not "
             "set. Refused request with untrusted chat template.")

# A template of the request's: each message in its role's tags, a variable
# of chat_template_kwargs, and what it sees of a "chat_template" variable.
TEMPLATE = ("{% if chat_template is defined %}[template seen]{% endif %}"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if mood is defined %}({{ mood }}){% endif %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
# TEMPLATE over MESSAGES, worked by hand.
RENDERED = "<system>Be brief.</system><user>Hi there</user><assistant>"
# The server's own template (``--chat-template``), and it over MESSAGES
# with the variable mood "calm", worked by hand.
SERVER_TEMPLATE = ("{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}"
                   "{% if mood is defined %}({{ mood }}){% endif %}")
SERVER_RENDERED = "[system: Be brief.][user: Hi there](calm)"


@pytest.fixture(scope="module")
def trusted(model_dir):
    with recording_app(model_dir, trust_request_chat_template=True) as app:
        yield app


@pytest.fixture(scope="module")
def untrusted(model_dir):
    with recording_app(model_dir, trust_request_chat_template=False) as app:
        yield app


def _chat(client, **extra):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                          extra_body={"return_prompt_text": True, **extra})


def _own_ids(hf, text: str) -> list[int]:
    """``text`` as the tokenizer encodes it, adding nothing (as a rendered
    prompt is tokenized: the template places any special tokens)."""
    return hf(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("extra, want", [
    ({"chat_template": TEMPLATE}, RENDERED),
    # The key is the template too, and no variable; the others stay variables.
    ({"chat_template_kwargs": {"chat_template": TEMPLATE, "mood": "calm"}},
     RENDERED.replace("<assistant>", "(calm)<assistant>")),
    # The field goes before the key.
    ({"chat_template": TEMPLATE, "chat_template_kwargs": {"chat_template": "{{ 'other' }}"}},
     RENDERED),
    ({"chat_template": TEMPLATE, "add_generation_prompt": False},
     RENDERED.removesuffix("<assistant>")),
])
def test_a_trusted_request_template_renders_the_prompt(trusted, hf, extra, want):
    link, _, client = trusted
    answer = _chat(client, **extra)
    assert answer.model_extra["prompt_text"] == want
    assert link.prompts[-1] == _own_ids(hf, want)
    assert answer.usage.prompt_tokens == len(_own_ids(hf, want))
    assert want != hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_an_empty_request_template_is_the_servers(trusted, hf):
    """As vLLM's ``chat_template or default``: "" asks for no template of
    the request's own."""
    link, _, client = trusted
    answer = _chat(client, chat_template="")
    model_text = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert answer.model_extra["prompt_text"] == model_text
    assert link.prompts[-1] == _own_ids(hf, model_text)


def test_a_trusted_request_template_in_tokenize_and_responses(trusted, hf):
    link, http, client = trusted
    tokens = http.post("/tokenize", json={"model": "tiny", "messages": MESSAGES,
                                          "chat_template": TEMPLATE}).json()
    assert tokens["tokens"] == _own_ids(hf, RENDERED)
    kwargs = {"chat_template": TEMPLATE, "mood": "calm"}
    answer = client.responses.create(model="tiny", instructions="Be brief.", input="Hi there",
                                     max_output_tokens=2,
                                     extra_body={"chat_template_kwargs": kwargs})
    want = RENDERED.replace("<assistant>", "(calm)<assistant>")
    assert link.prompts[-1] == _own_ids(hf, want)
    assert answer.usage.input_tokens == len(_own_ids(hf, want))


@pytest.mark.parametrize("extra, want", [
    # vLLM resolves the template from the field and the server's, which
    # goes over the kwargs' key: the key alone leaves the server's.
    ({"chat_template_kwargs": {"chat_template": TEMPLATE, "mood": "calm"}}, SERVER_RENDERED),
    ({"chat_template": TEMPLATE, "chat_template_kwargs": {"mood": "calm"}},
     RENDERED.replace("<assistant>", "(calm)<assistant>")),
    ({"chat_template": "", "chat_template_kwargs": {"chat_template": TEMPLATE, "mood": "calm"}},
     SERVER_RENDERED),
])
def test_a_server_template_goes_before_the_kwargs_key(model_dir, hf, extra, want):
    with recording_app(model_dir, trust_request_chat_template=True,
                       chat_template=SERVER_TEMPLATE) as (link, http, client):
        assert _chat(client, **extra).model_extra["prompt_text"] == want
        assert link.prompts[-1] == _own_ids(hf, want)
        tokens = http.post("/tokenize", json={"model": "tiny", "messages": MESSAGES,
                                              **extra}).json()
        assert tokens["tokens"] == _own_ids(hf, want)
        client.responses.create(model="tiny", instructions="Be brief.", input="Hi there",
                                max_output_tokens=2,
                                extra_body={"chat_template_kwargs": {"chat_template": TEMPLATE,
                                                                     "mood": "calm"}})
        assert link.prompts[-1] == _own_ids(hf, SERVER_RENDERED)


def test_tokenizer_info_gives_the_template_the_chat_routes_render(model_dir, hf):
    """``/tokenizer_info``'s chat template is the one a chat request without
    its own is rendered with: the server's where it has one (vLLM reports
    its ``--chat-template`` there), else the model's."""
    with recording_app(model_dir, chat_template=SERVER_TEMPLATE) as app:
        assert app.http.get("/tokenizer_info").json()["chat_template"] == SERVER_TEMPLATE
        assert (_chat(app.client).model_extra["prompt_text"]
                == "[system: Be brief.][user: Hi there]")  # SERVER_TEMPLATE, no mood
    with recording_app(model_dir) as app:
        assert app.http.get("/tokenizer_info").json()["chat_template"] == hf.chat_template


@pytest.mark.parametrize("extra, param", [
    ({"chat_template": TEMPLATE}, "chat_template"),
    ({"chat_template": ""}, "chat_template"),  # vLLM refuses any template given, "" too
    ({"chat_template_kwargs": {"chat_template": TEMPLATE}}, "chat_template_kwargs"),
])
def test_an_untrusted_request_template_is_refused_with_vllms_message(untrusted, extra, param):
    link, _, client = untrusted
    before = len(link.prompts)
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, **extra)
    assert refused.value.status_code == 400
    assert refused.value.body["message"] == UNTRUSTED
    assert refused.value.body["param"] == param
    assert len(link.prompts) == before  # nothing reached the engine


def test_an_untrusted_request_template_in_tokenize_and_responses(untrusted):
    link, http, client = untrusted
    answer = http.post("/tokenize", json={"model": "tiny", "messages": MESSAGES,
                                          "chat_template": TEMPLATE})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == UNTRUSTED
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                extra_body={"chat_template_kwargs": {"chat_template": TEMPLATE}})
    assert refused.value.body["message"] == UNTRUSTED
    # Other kwargs are variables, not a template: served as before.
    client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                            extra_body={"chat_template_kwargs": {"mood": "calm"}})
    assert _chat(client).model_extra["prompt_text"].endswith("<|assistant|>\n")


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m.content }}", "does not compile"),
    ("{{ raise_exception('this template takes no system message') }}",
     "this template takes no system message"),
    ("{{ 1 // 0 }}", "failed on these messages"),
    # The sandbox: no reaching past the variables.
    ("{{ messages.__class__.__mro__ }}", "failed on these messages"),
    ("{{ ''.__class__.__subclasses__() }}", "failed on these messages"),
    ("{% for m in messages %}{% endfor %}", "rendered an empty prompt"),
])
def test_a_broken_request_template_is_a_400_and_serving_goes_on(trusted, hf, template, message):
    link, http, client = trusted
    before = len(link.prompts)
    with pytest.raises(openai.BadRequestError, match=message) as refused:
        _chat(client, chat_template=template)
    assert refused.value.status_code == 400
    answer = http.post("/tokenize", json={"model": "tiny", "messages": MESSAGES,
                                          "chat_template": template})
    assert answer.status_code == 400 and message in answer.json()["error"]["message"]
    assert len(link.prompts) == before
    assert _chat(client, chat_template=TEMPLATE).model_extra["prompt_text"] == RENDERED


def test_beam_search_takes_the_request_template(trusted, hf):
    _, _, client = trusted
    answer = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, n=2,
        extra_body={"use_beam_search": True, "chat_template": TEMPLATE,
                    "return_token_ids": True})
    assert answer.model_extra["prompt_token_ids"] == _own_ids(hf, RENDERED)


@pytest.mark.timeout(180)
def test_serve_flag_trusts_request_templates(tmp_path, hf):
    """``tprun serve --trust-request-chat-template``: the engine's prompt is
    the request template's text (its token count the tokenizer's own
    encode of the hand-rendered text); with ``--chat-template`` beside it,
    the server's template goes before the kwargs' key."""
    with serving_tiny(tmp_path, "serve", "--model", "tiny", "--device", "cpu",
                      "--disable-log-stats", "--trust-request-chat-template",
                      "--chat-template", SERVER_TEMPLATE) as served:
        with openai_client(served) as client:
            answer = _chat(client, chat_template=TEMPLATE)
            assert answer.model_extra["prompt_text"] == RENDERED
            assert answer.usage.prompt_tokens == len(_own_ids(hf, RENDERED))
            answer = _chat(client, chat_template_kwargs={"chat_template": TEMPLATE,
                                                         "mood": "calm"})
            assert answer.model_extra["prompt_text"] == SERVER_RENDERED
            tokens = httpx.post(f"{served.url}/tokenize", timeout=30,
                                json={"messages": MESSAGES, "chat_template": TEMPLATE}).json()
            assert tokens["tokens"] == _own_ids(hf, RENDERED)
