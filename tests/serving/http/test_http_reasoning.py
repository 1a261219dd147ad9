"""A reasoning parser on the chat and Responses routes, through the
official ``openai`` client, in process over an engine link that answers
with text written here (``TextLink``: each piece one delta, its token ids
the tokenizer's), on ``tiny`` with ``<think>``/``</think>`` tokens
(``tests.helpers.think_model``). The expected splits are worked out by
hand from vLLM's rules: the reasoning in ``message.reasoning`` and in the
stream's ``reasoning`` deltas until ``</think>``, the content after it; an
output without ``</think>`` all reasoning, unless the prompt ended the
reasoning or (qwen3) the request turned thinking off."""

from __future__ import annotations

import contextlib
import json

import openai
import pytest
from fastapi.testclient import TestClient

from checkpoint.tiny_model import TINY_NAME
from checkpoint.tokenizer import Tokenizer
from engine.reasoning import Reasoning
from serving.http.app import create_app
from tests.helpers.engine_links import TextLink, made_up_logprob
from tests.helpers.proc_utils import run_tprun
from tests.helpers.think_model import END_THINK, THINK, tiny_with_think_tokens

MESSAGES = [{"role": "user", "content": "Two and two?"}]
ANSWER = ["<think>", "Two", " and two.", "</think>", "\n\nFour."]
CUT = ["Two", " and", " two"]  # cut (finish "length") before any </think>
TOOLS = [{"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("think")
    return tiny_with_think_tokens(str(root / "cache"), str(root / "model"))


@pytest.fixture(scope="module")
def think_tokenizer(think_dir) -> Tokenizer:
    return Tokenizer.from_dir(think_dir)


@contextlib.contextmanager
def _client(tokenizer, pieces, parser="deepseek_r1", finish_reason="stop", **app):
    reasoning = None if parser is None else Reasoning.named(parser, tokenizer)
    link = TextLink(tokenizer, pieces, finish_reason, reasoning)
    with TestClient(create_app(link, tokenizer, ["tiny"], 4096, reasoning_parser=parser,
                               **app)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http,
                            max_retries=0)


def _chat(client, **fields):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, **fields)


def _deltas(client, **fields) -> list[dict]:
    """Each streamed chunk's delta, as the fields it has."""
    return [c.choices[0].delta.model_dump(exclude_none=True)
            for c in _chat(client, stream=True, **fields) if c.choices]


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_the_reasoning_has_its_own_field_whole_and_streamed(think_tokenizer, parser):
    with _client(think_tokenizer, ANSWER, parser) as client:
        message = _chat(client).choices[0].message
        assert (message.reasoning, message.content) == ("Two and two.", "\n\nFour.")
        assert message.model_dump()["reasoning"] == "Two and two."
        assert _deltas(client) == [{"role": "assistant", "content": ""},
                                   {"reasoning": "Two"}, {"reasoning": " and two."},
                                   {"content": "\n\nFour."}]
        with client.chat.completions.stream(model="tiny", messages=MESSAGES) as stream:
            list(stream)
            streamed = stream.get_final_completion().choices[0].message
        assert (streamed.reasoning, streamed.content) == ("Two and two.", "\n\nFour.")


def test_usage_counts_the_reasoning_tokens(think_tokenizer):
    """vLLM's ``completion_tokens_details.reasoning_tokens``: the tokens
    before ``</think>``, tags not counted: "Two" (3 bytes) and " and two."
    (9) of ANSWER; every token of an output cut inside its reasoning; none
    of one that begins after it."""
    with _client(think_tokenizer, ANSWER) as client:
        usage = _chat(client, n=2).usage
        assert (usage.completion_tokens, usage.completion_tokens_details.reasoning_tokens) == \
            (2 * 21, 2 * 12)
        chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 12
        response = client.responses.create(model="tiny", input="Two and two?")
        assert response.usage.output_tokens_details.reasoning_tokens == 12
    with _client(think_tokenizer, CUT, "qwen3", "length") as client:
        assert _chat(client).usage.completion_tokens_details.reasoning_tokens == 11
        off = _chat(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert off.usage.completion_tokens_details.reasoning_tokens == 0
    with _client(think_tokenizer, ANSWER, parser=None) as client:
        assert _chat(client).usage.completion_tokens_details is None


def test_an_end_tag_inside_a_delta_splits_it(think_tokenizer):
    pieces = ["Two and", " two.</th", "ink>\n\nFour", "."]
    with _client(think_tokenizer, pieces) as client:
        message = _chat(client).choices[0].message
        assert (message.reasoning, message.content) == ("Two and two.", "\n\nFour.")
        assert _deltas(client)[1:] == [{"reasoning": "Two and"}, {"reasoning": " two."},
                                       {"content": "\n\nFour"}, {"content": "."}]


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_an_output_cut_before_its_end_tag_is_all_reasoning(think_tokenizer, parser):
    with _client(think_tokenizer, CUT, parser, "length") as client:
        choice = _chat(client, max_tokens=3).choices[0]
        assert (choice.message.reasoning, choice.message.content) == ("Two and two", None)
        assert choice.finish_reason == "length"
        deltas = _deltas(client, max_tokens=3)
        assert deltas[1:] == [{"reasoning": "Two"}, {"reasoning": " and"},
                              {"reasoning": " two"}]


@pytest.mark.parametrize("kwargs, parser, reasoning", [
    # The template closes the thinking in the prompt: no reasoning, either parser.
    ({"enable_thinking": False}, "deepseek_r1", None),
    ({"enable_thinking": False}, "qwen3", None),
    # A template that opens it whatever enable_thinking says (DeepSeek-R1's):
    # deepseek_r1 reads the output as reasoning, qwen3 takes the switch.
    ({"open_think": True, "enable_thinking": False}, "deepseek_r1", "Two and two"),
    ({"open_think": True, "enable_thinking": False}, "qwen3", None),
    ({"open_think": True}, "qwen3", "Two and two"),
])
def test_where_the_output_begins_after_its_reasoning_it_is_content(
        think_tokenizer, kwargs, parser, reasoning):
    with _client(think_tokenizer, CUT, parser, "length") as client:
        fields = dict(max_tokens=3, extra_body={"chat_template_kwargs": kwargs})
        message = _chat(client, **fields).choices[0].message
        want = (reasoning, None) if reasoning else (None, "Two and two")
        assert (message.reasoning, message.content) == want
        deltas = _deltas(client, **fields)[1:]
        kind = "reasoning" if reasoning else "content"
        assert deltas == [{kind: "Two"}, {kind: " and"}, {kind: " two"}]


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_reasoning_effort_none_turns_thinking_off(think_tokenizer, parser):
    """vLLM's ``reasoning_effort`` "none" sets the template's
    ``enable_thinking`` false: the template closes the thinking in the
    prompt, and the output is content; "high" leaves it on."""
    with _client(think_tokenizer, CUT, parser, "length") as client:
        off = _chat(client, max_tokens=3, extra_body={"reasoning_effort": "none"})
        assert (off.choices[0].message.reasoning, off.choices[0].message.content) == (
            None, "Two and two")
        on = _chat(client, max_tokens=3,
                   extra_body={"reasoning_effort": "high",
                               "chat_template_kwargs": {"open_think": True}})
        assert (on.choices[0].message.reasoning, on.choices[0].message.content) == (
            "Two and two", None)


@pytest.mark.parametrize("kwargs, told", [
    ({"enable_thinking": False, "open_think": True}, False),
    ({"enable_thinking": 0}, False),  # any false value, as vLLM reads it
    ({"enable_thinking": True}, True),
    (None, True),
])
def test_the_engine_is_told_the_requests_enable_thinking(think_tokenizer, kwargs, told):
    """``GenerateRequest.enable_thinking``, from which (and the prompt) the
    engine decides where each output begins; the chat's every choice
    carries it, a Responses request (no kwargs) leaves it on."""
    link = TextLink(think_tokenizer, ["x"])
    with TestClient(create_app(link, think_tokenizer, ["tiny"], 4096,
                               reasoning_parser="qwen3")) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none",
                               http_client=http, max_retries=0)
        _chat(client, n=2, extra_body={"chat_template_kwargs": kwargs} if kwargs else None)
        client.responses.create(model="tiny", input="Two and two?")
    assert link.enable_thinking == [told, told, True]


def test_content_after_the_end_tag_is_all_content(think_tokenizer):
    """A prompt that ended the reasoning leaves even a later end tag to the
    content, as text."""
    pieces = ["Four", "</think>", "."]
    with _client(think_tokenizer, pieces, "qwen3") as client:
        fields = dict(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        message = _chat(client, **fields).choices[0].message
        assert (message.reasoning, message.content) == (None, "Four</think>.")


def test_calls_are_read_from_the_content_only(think_tokenizer):
    pieces = ['<tool_call>{"name": "now", "arguments": {"in": "reasoning"}}</tool_call>',
              "</think>", "Sure.", '<tool_call>{"name": "now", "arguments": {}}</tool_call>']
    with _client(think_tokenizer, pieces, tool_call_parser="hermes") as client:
        choice = _chat(client, tools=TOOLS).choices[0]
        assert choice.message.reasoning == pieces[0]
        assert choice.message.content == "Sure."
        assert [(c.function.name, json.loads(c.function.arguments))
                for c in choice.message.tool_calls] == [("now", {})]
        assert choice.finish_reason == "tool_calls"
        deltas = _deltas(client, tools=TOOLS)
        assert deltas[1:3] == [{"reasoning": pieces[0]}, {"content": "Sure."}]
        [call] = [entry for d in deltas for entry in d.get("tool_calls", [])]
        assert call["function"] == {"name": "now", "arguments": "{}"}


def _ids_of(think_dir: str, pieces: list[str]) -> list[list[int]]:
    """Each piece's token ids, by the ``tokenizers`` library (as ``TextLink``
    sends them: one delta a piece)."""
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(f"{think_dir}/tokenizer.json")
    return [hf.encode(piece, add_special_tokens=False).ids for piece in pieces]


def _hf_prompt_ids(think_dir: str, **template) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(think_dir).apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False, **template))


def test_return_token_ids_are_the_raw_outputs(think_dir, think_tokenizer):
    """vLLM's ``return_token_ids`` beside a reasoning parser and a tool-call
    reader: each choice's ids are every id the engine sent, the reasoning's,
    its tags' and the call's markup included; streamed, each delta's ids come
    in its own chunk, also where no text comes out (``</think>``, dropped;
    the first half of a call, held back). The prompt's ids are transformers'
    rendering of the messages."""
    pieces = ["<think>", "Two.", "</think>", "Sure.", '<tool_call>{"name": "now", ',
              '"arguments": {}}</tool_call>']
    per_piece = _ids_of(think_dir, pieces)
    assert per_piece[0] == [THINK] and per_piece[2] == [END_THINK]
    with _client(think_tokenizer, pieces, tool_call_parser="hermes") as client:
        whole = _chat(client, n=2, tools=TOOLS, extra_body={"return_token_ids": True})
        assert whole.model_extra["prompt_token_ids"] == _hf_prompt_ids(think_dir, tools=TOOLS)
        for choice in whole.choices:
            assert choice.message.reasoning == "Two." and choice.message.content == "Sure."
            assert [c.function.name for c in choice.message.tool_calls] == ["now"]
            assert choice.model_extra["token_ids"] == [t for ids in per_piece for t in ids]
        chunks = list(_chat(client, stream=True, tools=TOOLS,
                            extra_body={"return_token_ids": True}))
        assert chunks[0].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
        assert "token_ids" not in chunks[0].choices[0].model_extra  # the role's chunk
        assert all("prompt_token_ids" not in c.model_extra for c in chunks[1:])
        assert [c.choices[0].model_extra["token_ids"] for c in chunks[1:]] == per_piece
        deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks[1:]]
        assert deltas[:4] == [{}, {"reasoning": "Two."}, {}, {"content": "Sure."}]
        assert deltas[4] == {}  # the call is not whole yet
        assert not any("token_ids" in c.choices[0].model_extra
                       for c in _chat(client, stream=True, tools=TOOLS) if c.choices)
        plain = _chat(client, tools=TOOLS)
        assert "prompt_token_ids" not in plain.model_extra
        assert "token_ids" not in plain.choices[0].model_extra


def test_return_token_ids_leave_out_a_hidden_reasoning(think_dir, think_tokenizer):
    """As vLLM's: with ``include_reasoning`` false the choices' ids would show
    the reasoning and are left out (no chunk is sent for them alone), the
    prompt's are still given."""
    with _client(think_tokenizer, ANSWER) as client:
        fields = dict(extra_body={"include_reasoning": False, "return_token_ids": True})
        whole = _chat(client, **fields)
        assert whole.model_extra["prompt_token_ids"] == _hf_prompt_ids(think_dir)
        assert "token_ids" not in whole.choices[0].model_extra
        chunks = list(_chat(client, stream=True, **fields))
        assert chunks[0].model_extra["prompt_token_ids"] == _hf_prompt_ids(think_dir)
        assert [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks[1:]] == [
            {"content": "\n\nFour."}]
        assert not any("token_ids" in c.choices[0].model_extra for c in chunks)


def test_include_reasoning_false_leaves_it_out(think_tokenizer):
    with _client(think_tokenizer, ANSWER) as client:
        fields = dict(extra_body={"include_reasoning": False})
        message = _chat(client, **fields).choices[0].message
        assert (message.reasoning, message.content) == (None, "\n\nFour.")
        assert _deltas(client, **fields)[1:] == [{"content": "\n\nFour."}]


def test_each_choice_is_split_on_its_own(think_tokenizer):
    with _client(think_tokenizer, ANSWER) as client:
        choices = _chat(client, n=2).choices
        assert [(c.message.reasoning, c.message.content) for c in choices] == \
            [("Two and two.", "\n\nFour.")] * 2


def test_a_server_without_a_parser_answers_the_text(think_tokenizer):
    with _client(think_tokenizer, ANSWER, parser=None) as client:
        message = _chat(client).choices[0].message
        assert message.content == "<think>Two and two.</think>\n\nFour."
        assert "reasoning" not in message.model_dump()


def test_responses_answer_a_reasoning_item_before_the_message(think_tokenizer):
    with _client(think_tokenizer, ANSWER, enable_responses_api_store=True) as client:
        whole = client.responses.create(model="tiny", input="Two and two?")
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        reasoning = whole.output[0]
        assert reasoning.id.startswith("rs_") and reasoning.summary == []
        assert [(p.type, p.text) for p in reasoning.content] == [
            ("reasoning_text", "Two and two.")]
        assert whole.output_text == "\n\nFour."
        events = list(client.responses.create(model="tiny", input="Two and two?", stream=True))
        kinds = [e.type for e in events]
        assert kinds[2:9] == ["response.output_item.added", "response.content_part.added",
                              "response.reasoning_text.delta", "response.reasoning_text.delta",
                              "response.reasoning_text.done", "response.content_part.done",
                              "response.output_item.done"]
        assert [e.delta for e in events if e.type == "response.reasoning_text.delta"] == \
            ["Two", " and two."]
        done = events[-1].response
        assert [i.type for i in done.output] == ["reasoning", "message"]
        assert done.output[0].content[0].text == "Two and two." and done.output_text == \
            "\n\nFour."
        # The answer goes on: stored, and sent back as input (its reasoning item too).
        again = client.responses.create(model="tiny", input="And three?",
                                        previous_response_id=whole.id)
        assert again.status == "completed"
        sent_back = [*[i.model_dump(exclude_none=True) for i in whole.output],
                     {"role": "user", "content": "And three?"}]
        listed = client.responses.input_items.list(
            client.responses.create(model="tiny", input=sent_back).id)
        assert [i.type for i in listed.data][::-1] == ["reasoning", "message", "message"]


def test_responses_cut_in_its_reasoning_has_the_reasoning_item_alone(think_tokenizer):
    with _client(think_tokenizer, CUT, finish_reason="length") as client:
        whole = client.responses.create(model="tiny", input="Two and two?",
                                        max_output_tokens=3)
        assert (whole.status, [i.type for i in whole.output]) == ("incomplete", ["reasoning"])
        assert whole.output[0].content[0].text == "Two and two"


@pytest.mark.parametrize("pieces, first", [
    (ANSWER, 14),  # <think>, 12 reasoning tokens, </think>: the answer from token 14 on
    (["Two and", " two.</think>\n\nFour", "."], 13),  # the tag inside a delta
])
def test_responses_logprobs_are_the_answers_tokens_alone(think_tokenizer, pieces, first):
    """The answer's ``output_text`` holds the logprobs of the tokens after
    ``</think>`` (TextLink's made-up logprob names each token's place): the
    reasoning's and the tag's go nowhere, as in vLLM's stream, whose
    reasoning deltas carry none; streamed, the text deltas carry the same,
    and the reasoning deltas none."""
    want = [("\n", made_up_logprob(first)), ("\n", made_up_logprob(first + 1))] + [
        (c, made_up_logprob(first + 2 + i)) for i, c in enumerate("Four.")]
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 1}
    with _client(think_tokenizer, pieces) as client:
        whole = client.responses.create(model="tiny", input="Two and two?", **asked)
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        text = whole.output[1].content[0]
        assert text.text == "\n\nFour."
        assert [(lp.token, lp.logprob) for lp in text.logprobs] == want
        assert [lp.bytes for lp in text.logprobs] == [list(t.encode()) for t, _ in want]
        assert [[(t.token, t.logprob) for t in lp.top_logprobs] for lp in text.logprobs] == [
            [pair] for pair in want]
        events = list(client.responses.create(model="tiny", input="Two and two?",
                                              stream=True, **asked))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        assert "".join(e.delta for e in deltas) == "\n\nFour."
        assert [(lp.token, lp.logprob) for e in deltas for lp in e.logprobs] == want
        done = next(e for e in events if e.type == "response.output_text.done")
        assert [(lp.token, lp.logprob) for lp in done.logprobs] == want
        assert [(lp.token, lp.logprob) for lp in
                events[-1].response.output[1].content[0].logprobs] == want
        assert all("logprobs" not in e.model_dump() for e in events
                   if e.type.startswith("response.reasoning_text"))


@pytest.mark.timeout(120)
def test_an_unknown_parser_is_one_error_line_before_anything_starts(tmp_path):
    env = {"TPRUN_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    result, leftovers = run_tprun(["serve", "--device", "cpu", "--http-port", "0",
                                   "--reasoning-parser", "granite"], timeout=100, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "tprun: error: reasoning_parser must be one of deepseek_r1, qwen3, got 'granite'"]
    assert leftovers == []
    assert not (tmp_path / TINY_NAME).exists()  # refused before the model was written
