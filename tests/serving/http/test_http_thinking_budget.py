"""vLLM's ``thinking_token_budget`` over HTTP, end to end: ``tprun serve
--reasoning-parser deepseek_r1 --http-port`` of ``tiny`` with ``<think>``
and ``</think>`` (``tests.helpers.think_model``), driven by the official
``openai`` client. Greedy ``tiny`` never writes ``</think>`` by itself, so
an answer without a budget is all reasoning; the reference for budget N
is that same answer cut at N tokens: with the budget the output's first
N ids are its ids, the message's ``reasoning`` their text (by the
``tokenizers`` library), ``</think>`` comes next (forced) and the rest is ``content``; streamed,
the same split. The budget counts as vLLM's does, in a thinking section
the prompt or the output opened: after the template's ``<think>\\n`` the
prompt's newline is one reasoning token already, leaving N - 1; after a
bare generation prompt nothing is forced."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.http_utils import openai_client, serving_think_model
from tests.helpers.think_model import END_THINK

pytestmark = pytest.mark.timeout(300)

MESSAGES = [{"role": "user", "content": "Two and two?"}]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_think_model(tmp_path_factory.mktemp("budget"), "--reasoning-parser",
                             "deepseek_r1") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def _hf_text(server, ids: list[int]) -> str:
    """The text of ``ids`` by the ``tokenizers`` library (a byte sequence
    cut inside a character ends in U+FFFD)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{server.model_dir}/tokenizer.json").decode(ids)


def _chat(server, client, budget=None, max_tokens=MAX_TOKENS, kwargs=None, **fields):
    extra = {"return_token_ids": True, **({"chat_template_kwargs": kwargs} if kwargs else {}),
             **({"thinking_token_budget": budget} if budget is not None else {})}
    return client.chat.completions.create(model=server.model_dir, messages=MESSAGES,
                                          temperature=0, max_tokens=max_tokens,
                                          extra_body=extra, **fields)


OPEN = {"open_think": True}  # the template writes <think>\n: one reasoning token in the prompt


@pytest.mark.parametrize("n", [2, 5])
def test_the_reasoning_is_cut_at_the_budget(server, client, n):
    kwargs, in_prompt = OPEN, 1
    free = _chat(server, client, max_tokens=n - in_prompt, kwargs=kwargs).choices[0]
    assert free.message.content is None  # all reasoning: no </think> of its own
    free_ids = free.model_extra["token_ids"]
    answer = _chat(server, client, n, kwargs=kwargs)
    choice = answer.choices[0]
    ids = choice.model_extra["token_ids"]
    assert ids[:n - in_prompt] == free_ids
    assert ids[n - in_prompt] == END_THINK and ids.count(END_THINK) == 1
    assert choice.message.reasoning == _hf_text(server, free_ids)
    assert choice.message.content  # the answer goes on after the forced end
    assert answer.usage.completion_tokens == MAX_TOKENS
    assert answer.usage.completion_tokens_details.reasoning_tokens == n - in_prompt
    reasoning = content = ""
    for chunk in _chat(server, client, n, kwargs=kwargs, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning", None) or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (choice.message.reasoning, choice.message.content)


def test_a_prompt_that_opened_no_thinking_section_is_left_alone(server, client):
    """As vLLM counts: no ``<think>`` open in the prompt, none written by the
    output (greedy ``tiny`` writes neither tag): nothing is forced, though
    deepseek_r1 reads the whole answer as reasoning."""
    free = _chat(server, client).choices[0]
    assert free.message.content is None
    assert _chat(server, client, 2).choices[0].model_extra["token_ids"] == free.model_extra[
        "token_ids"]


def test_budget_zero_ends_the_thinking_at_once_and_minus_one_is_no_limit(server, client):
    zero = _chat(server, client, 0, kwargs=OPEN).choices[0]
    assert zero.model_extra["token_ids"][0] == END_THINK
    assert zero.message.reasoning == "" and zero.message.content
    unlimited = _chat(server, client, -1).choices[0]
    assert unlimited.model_extra["token_ids"] == _chat(server, client).choices[0].model_extra[
        "token_ids"]


def test_completions_take_it_too(server, client):
    """A text prompt that ends in ``<think>`` opened a section: the budget's
    tokens, then ``</think>``."""
    answer = client.completions.create(model=server.model_dir, prompt="Two and two?<think>",
                                       temperature=0, max_tokens=6,
                                       extra_body={"thinking_token_budget": 2,
                                                   "return_token_ids": True})
    assert answer.choices[0].model_extra["token_ids"][2] == END_THINK


def test_a_negative_budget_is_a_400_naming_it(server, client):
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(server, client, -2)
    assert refused.value.body["param"] == "thinking_token_budget"
    assert "thinking_token_budget must be" in refused.value.body["message"]


def test_the_forced_end_reports_the_models_own_logprob(server, client):
    """The forced ``</think>`` reports the model's own logprob at its place
    (vLLM's default "raw_logprobs": the logits before any processor, its
    budget one of them): transformers' log-softmax over the answer's
    ``prompt_token_ids`` and the tokens before it, below 0, with the
    model's own top tokens; not the 0 of a distribution forced to it."""
    import torch
    import transformers

    answer = _chat(server, client, 2, kwargs=OPEN, logprobs=True, top_logprobs=2)
    ids = answer.choices[0].model_extra["token_ids"]
    assert ids[1] == END_THINK  # one reasoning token in the prompt, one in the output
    model = transformers.LlamaForCausalLM.from_pretrained(server.model_dir,
                                                          torch_dtype=torch.float32)
    sequence = answer.model_extra["prompt_token_ids"] + ids[:1]
    with torch.no_grad():
        want = torch.log_softmax(model(torch.tensor([sequence])).logits[0, -1].double(), -1)
    forced = answer.choices[0].logprobs.content[1]
    assert forced.token == "</think>"
    assert forced.logprob == pytest.approx(float(want[END_THINK]), abs=1e-4)
    assert forced.logprob < -1.0
    top = torch.topk(want, 2)
    assert [t.logprob for t in forced.top_logprobs] == pytest.approx(top.values.tolist(),
                                                                     abs=1e-4)
