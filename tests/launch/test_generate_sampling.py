"""``tprun generate``'s sampling options only translate flags into
``SamplingParams``: its completions (every one of ``--n``), their logprobs
and ``--chat``'s are those of the in-process ``LLM`` given the same
parameters; a value ``SamplingParams`` refuses is one ``tprun: error:``
line naming the option, exit code 2, before any worker starts."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, SamplingParams
from launch import cli
from tests.helpers.proc_utils import run_tprun

PROMPTS = ["Hello, my name is", "The future of AI is"]
SAMPLING = dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.02, seed=7, n=2, max_tokens=12,
                min_tokens=2, presence_penalty=0.5, frequency_penalty=0.25,
                repetition_penalty=1.1, logprobs=2)
SAMPLING_FLAGS = ["--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.02",
                  "--sampling-seed", "7", "--n", "2", "--max-tokens", "12", "--min-tokens", "2",
                  "--presence-penalty", "0.5", "--frequency-penalty", "0.25",
                  "--repetition-penalty", "1.1", "--logprobs", "2"]


@pytest.fixture(scope="module")
def llm():
    with LLM(model="tiny", device="cpu") as llm:
        yield llm


def _later_printable(text: str) -> str:
    """A printable ASCII character of ``text`` after its first: a stop
    string the completion meets."""
    return next(c for c in text[1:] if c.isascii() and c.isprintable() and c != " ")


def _generate(flags: list[str], tmp_path) -> list[dict]:
    result, leftovers = run_tprun(["generate", "--model", "tiny", "--device", "cpu", "--json",
                                   *flags], timeout=100, env={"TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert leftovers == []
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.timeout(150)
def test_sampling_flags_give_llms_completions_and_logprobs(llm, tmp_path):
    """Two stop strings that the completions without them meet (so some end
    there), a stop token id, and every other sampling flag at once."""
    free = llm.generate(PROMPTS, SamplingParams(**SAMPLING))
    stops = [_later_printable(free[0].outputs[0].text), _later_printable(free[1].outputs[1].text)]
    stop_id = free[1].outputs[0].token_ids[5]
    reference = llm.generate(PROMPTS, SamplingParams(**SAMPLING, stop=stops,
                                                     stop_token_ids=[stop_id]))
    assert "stop" in [c.finish_reason for out in reference for c in out.outputs]

    objects = _generate([*SAMPLING_FLAGS, "--stop", stops[0], "--stop", stops[1],
                         "--stop-token-ids", str(stop_id), *sum((["--prompt", p] for p in PROMPTS),
                                                                [])], tmp_path)
    expected = [(i, out, c) for i, out in enumerate(reference) for c in out.outputs]
    assert len(objects) == len(expected) == 4
    for obj, (i, out, completion) in zip(objects, expected):
        assert (obj["index"], obj["choice"]) == (i, completion.index)
        assert obj["prompt_token_ids"] == out.prompt_token_ids
        assert obj["token_ids"] == completion.token_ids
        assert obj["text"] == completion.text
        assert obj["finish_reason"] == completion.finish_reason
        assert len(obj["logprobs"]) == len(completion.logprobs)
        for entries, step in zip(obj["logprobs"], completion.logprobs):
            assert [(t, rank) for t, _, rank in entries] == [(t, p.rank) for t, p in step.items()]
            assert [lp for _, lp, _ in entries] == pytest.approx(
                [p.logprob for p in step.values()], abs=1e-5)
        assert obj["cumulative_logprob"] == pytest.approx(completion.cumulative_logprob, abs=1e-4)


@pytest.mark.timeout(150)
def test_chat_sends_each_prompt_as_a_user_message(llm, tmp_path):
    prompts = ["Hi there", "What is 2 + 2?"]
    reference = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                         SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    objects = _generate(["--chat", "--max-tokens", "8", "--ignore-eos",
                         "--prompt", prompts[0], "--prompt", prompts[1]], tmp_path)
    assert len(objects) == 2
    for i, (obj, out) in enumerate(zip(objects, reference)):
        assert obj == {"index": i, "prompt_token_ids": out.prompt_token_ids,
                       "token_ids": out.outputs[0].token_ids, "text": out.outputs[0].text,
                       "finish_reason": out.outputs[0].finish_reason}


class _WorkersStarted(Exception):
    """What the stand-in for ``LLM.from_config`` raises: the launch got as
    far as starting the engine and its workers."""


@pytest.fixture
def no_engine(monkeypatch):
    """``LLM.from_config`` replaced by a stand-in that notes each call."""
    calls = []

    def from_config(config):
        calls.append(config)
        raise _WorkersStarted

    monkeypatch.setattr(LLM, "from_config", staticmethod(from_config))
    return calls


def _run(flags: list[str]) -> int:
    return cli.main(["generate", "--model", "tiny", "--device", "cpu", "--prompt", "Hi",
                     *flags])


@pytest.mark.parametrize("flags, flag", [
    (["--top-p", "1.5"], "--top-p"),
    (["--n", "2"], "--n"),  # greedy: temperature 0 by default
    (["--top-k", "-2"], "--top-k"),
    (["--min-p", "1.5"], "--min-p"),
    (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--presence-penalty", "2.5"], "--presence-penalty"),
    (["--frequency-penalty", "-3"], "--frequency-penalty"),
    (["--min-tokens", "40"], "--min-tokens"),  # above --max-tokens 32
    (["--stop", ""], "--stop"),
    (["--stop-token-ids", "3,-1"], "--stop-token-ids"),
    (["--logprobs", "-3"], "--logprobs"),
    (["--logprobs", "21"], "--logprobs"),  # above --max-logprobs 20
    (["--logprobs", "8", "--max-logprobs", "5"], "--logprobs"),
    (["--thinking-token-budget", "5"], "--thinking-token-budget"),  # no reasoning parser
    (["--chat", "--prompt-token-ids", "1,2"], "--chat"),
])
def test_refused_values_are_one_line_naming_the_flag_before_any_worker(
        no_engine, capsys, flags, flag):
    assert _run(flags) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tprun: error: {flag}"), lines
    assert no_engine == []


@pytest.mark.parametrize("flags", [["--logprobs", "20"],
                                   ["--logprobs", "30", "--max-logprobs", "30"],
                                   ["--logprobs", "30", "--max-logprobs", "-1"],
                                   ["--logprobs", "-1", "--max-logprobs", "-1"]])
def test_logprobs_within_max_logprobs_reach_the_engine(no_engine, flags):
    with pytest.raises(_WorkersStarted):
        _run(flags)
    assert len(no_engine) == 1


def test_a_thinking_budget_with_a_reasoning_parser_reaches_the_engine(no_engine):
    with pytest.raises(_WorkersStarted):
        _run(["--thinking-token-budget", "5", "--reasoning-parser", "qwen3"])
    assert [c.reasoning_parser for c in no_engine] == ["qwen3"]


def _strict(constant: str):
    raise ValueError(f"{constant} is no JSON")


@pytest.mark.timeout(150)
def test_json_logprobs_of_masked_tokens_are_json(llm, tmp_path):
    """A token the constraint masks has logprob -inf, which JSON cannot
    carry: --json shows it -9999.0 (as vLLM's server clamps it), every
    other logprob as LLM gives it, and each line reads as strict JSON."""
    reference = llm.generate(["Hi"], SamplingParams(
        max_tokens=2, logprobs=5, structured_outputs={"choice": ["ab", "cd"]}))
    [completion] = reference[0].outputs
    assert any(p.logprob == float("-inf") for step in completion.logprobs
               for p in step.values())  # some of the top 5 are masked
    result, leftovers = run_tprun(["generate", "--model", "tiny", "--device", "cpu", "--json",
                                   "--prompt", "Hi", "--max-tokens", "2", "--logprobs", "5",
                                   "--choice", "ab", "cd"], timeout=100,
                                  env={"TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert leftovers == []
    [obj] = [json.loads(line, parse_constant=_strict) for line in result.stdout.splitlines()]
    assert obj["token_ids"] == completion.token_ids
    for entries, step in zip(obj["logprobs"], completion.logprobs, strict=True):
        assert [(t, rank) for t, _, rank in entries] == [(t, p.rank) for t, p in step.items()]
        assert [lp for _, lp, _ in entries] == pytest.approx(
            [max(p.logprob, -9999.0) for p in step.values()], abs=1e-5)


@pytest.mark.timeout(150)
def test_chat_with_a_model_without_a_chat_template_is_one_line_naming_chat(tiny_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    settings = json.loads((model / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    result, leftovers = run_tprun(["generate", "--model", str(model), "--device", "cpu",
                                   "--chat", "--prompt", "Hi"], timeout=100)
    assert result.returncode == 2, result.stderr
    assert leftovers == []
    errors = [line for line in result.stderr.splitlines() if line.startswith("tprun: error:")]
    assert errors == [f"tprun: error: --chat renders the model's chat template, and {model} "
                      "has none: give the prompts without --chat"], result.stderr
