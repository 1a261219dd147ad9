"""``LLM``'s vLLM-shaped API beyond one plain completion: ``n`` completions (greedy: ``n`` 1),
stop strings, ``max_tokens=None`` and past the context, ``cumulative_logprob``, prompts from a
generator, ``LLM.chat``, each output's ``metrics``, params assigned before and after
submitting (checked once, in a copy the caller does not hold). References: separate requests
with the choices' seeds, a plain search over the decoded greedy output for the stop string,
the context left after the prompt, a bias that fixes every token, transformers'
``apply_chat_template`` on the same tokenizer, the clocks read around the call."""

from __future__ import annotations

import pytest

from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, RequestOutputKind, SamplingParams
from ipc.errors import InvalidRequestError
from tests.helpers.hf_models import SPM_WORD_STARTS, save_sentencepiece_style
from tests.helpers.request_metrics import Window, assert_in_order
from tests.helpers.vllm_detokenizer import vllm_fast_text

PROMPT = "The quick brown fox jumps over"
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPRUN_CACHE", str(tmp_path_factory.mktemp("cache")))
    with LLM(model="tiny", device="cpu", max_model_len=MAX_MODEL_LEN) as llm:
        yield llm
    mp.undo()


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 16, "ignore_eos": True, **kw})


@pytest.mark.timeout(300)
def test_n_completions_are_the_choices_seeds(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    [out] = llm.generate(PROMPT, params)
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    singles = llm.generate([PROMPT] * 3, [SamplingParams(temperature=1.0, seed=11 + i,
                                                         max_tokens=6, ignore_eos=True)
                                          for i in range(3)])
    assert [c.token_ids for c in out.outputs] == [s.outputs[0].token_ids for s in singles]
    assert [c.text for c in out.outputs] == [s.outputs[0].text for s in singles]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # the seeds differ


@pytest.mark.timeout(300)
def test_greedy_n_above_1_is_refused_naming_n_and_the_engine_goes_on(llm):
    """vLLM's rule (its choices could not differ): ``n`` 2 at temperature 0
    is an ``InvalidRequestError`` whose ``param`` is ``n``, also when the
    temperature is assigned after construction; nothing is scheduled, and
    the same request with ``n`` 1 is served."""
    prompt = {"prompt_token_ids": [5, 6, 7]}
    with pytest.raises(InvalidRequestError, match="n must be 1 when sampling greedily") as e:
        llm.generate(prompt, _greedy(n=2, max_tokens=4))
    assert e.value.param == "n"
    params = SamplingParams(n=2, temperature=0.8, max_tokens=4, ignore_eos=True)
    params.temperature = 0.0
    with pytest.raises(InvalidRequestError, match="n must be 1 when sampling greedily"):
        llm.generate(prompt, params)
    assert not llm.engine.has_unfinished_requests()
    [one] = llm.generate(prompt, _greedy(max_tokens=4))
    assert len(one.outputs) == 1 and len(one.outputs[0].token_ids) == 4


def _expected_stop(tokenizer, ids: list[int], stop: str, min_tokens: int):
    """(tokens kept, text) by the rule written out: the first k > min_tokens
    whose decoded text holds ``stop`` ending past the text of the first
    ``min_tokens`` tokens; its text cut at the earliest such occurrence."""
    floor = len(tokenizer.decode(ids[:min_tokens]))
    for k in range(min_tokens + 1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        hits = [i for i in range(len(text))
                if text.startswith(stop, i) and i + len(stop) > floor]
        if hits:
            return k, text[:hits[0]]
    return None


@pytest.mark.timeout(300)
def test_stop_strings_cut_text_and_tokens(llm):
    tokenizer = llm.get_tokenizer()
    [ref] = llm.generate(PROMPT, _greedy())
    ids, text = ref.outputs[0].token_ids, ref.outputs[0].text
    # The whole decode less what vLLM's detokenizer holds back at the end.
    assert text == vllm_fast_text(tokenizer.hf, ref.prompt_token_ids, ids)
    assert tokenizer.decode(ids).startswith(text)
    # A stop string from the second half of the text, first seen there.
    at = next(i for i in range(len(text) // 2, len(text) - 2)
              if text.find(text[i:i + 3]) == i and text[i:i + 3].strip())
    stop = text[at:at + 3]
    cases = [(stop, 0), ("never-in-this-text", 0)]
    # min_tokens covering the first occurrence: it no longer stops the output.
    cover = next(m for m in range(1, len(ids) + 1)
                 if len(tokenizer.decode(ids[:m])) >= at + len(stop))
    cases.append((stop, cover))
    for stop_string, min_tokens in cases:
        [out] = llm.generate(PROMPT, _greedy(stop=[stop_string, "\x00\x01"],
                                             min_tokens=min_tokens))
        c = out.outputs[0]
        expected = _expected_stop(tokenizer, ids, stop_string, min_tokens)
        if expected is None:
            assert (c.token_ids, c.text, c.finish_reason) == (ids, text, "length")
            assert c.stop_reason is None
        else:
            k, cut = expected
            assert (c.token_ids, c.text) == (ids[:k], cut)
            assert (c.finish_reason, c.stop_reason) == ("stop", stop_string)
    # The engine is idle again: the stopped request was aborted there.
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.timeout(120)
def test_the_first_stop_string_completed_ends_the_output(llm):
    """Stops ["y", "xyz"] where the greedy text (lowercase letters only, one
    token each) first has "y" at j, after "x" and before "z": "y" ends the
    output at token j, whose text completed it, though "xyz" began earlier
    and comes true a token later (vLLM's rule: generation stops when a stop
    string is generated); the output keeps the tokens up to j and their
    logprobs only (hand-worked from the greedy ids)."""
    letters = list(range(ord("a"), ord("z") + 1))
    [ref] = llm.generate(PROMPT, _greedy(allowed_token_ids=letters))
    ids, text = ref.outputs[0].token_ids, ref.outputs[0].text
    assert text == "".join(map(chr, ids))
    j = next(i for i in range(1, len(text) - 1) if text[i] not in text[:i])
    stops = [text[j], text[j - 1:j + 2]]
    [out] = llm.generate(PROMPT, _greedy(allowed_token_ids=letters, stop=stops, logprobs=1))
    c = out.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", text[j])
    assert (c.token_ids, c.text) == (ids[:j + 1], text[:j])
    assert len(c.logprobs) == j + 1
    assert c.cumulative_logprob == pytest.approx(
        sum(entry[t].logprob for t, entry in zip(c.token_ids, c.logprobs)))


@pytest.mark.timeout(120)
def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm):
    """vLLM's rule: k keeps the prompt's last k tokens, -1 its last
    ``max_model_len``; the reference is the same tokens given as the prompt."""
    long = list(range(100, 100 + MAX_MODEL_LEN + 6))
    [cut] = llm.generate({"prompt_token_ids": long}, _greedy(max_tokens=4,
                                                             truncate_prompt_tokens=10))
    [ref] = llm.generate({"prompt_token_ids": long[-10:]}, _greedy(max_tokens=4))
    assert cut.prompt_token_ids == long[-10:]
    assert cut.outputs[0].token_ids == ref.outputs[0].token_ids
    short = long[:MAX_MODEL_LEN // 2]
    [whole] = llm.generate({"prompt_token_ids": short}, _greedy(max_tokens=4,
                                                                truncate_prompt_tokens=-1))
    [ref] = llm.generate({"prompt_token_ids": short}, _greedy(max_tokens=4))
    assert whole.prompt_token_ids == short
    assert whole.outputs[0].token_ids == ref.outputs[0].token_ids
    # The last max_model_len tokens leave no room for output: refused as such.
    with pytest.raises(ValueError, match=rf"prompt \({MAX_MODEL_LEN} tokens\)"):
        llm.generate({"prompt_token_ids": long}, _greedy(max_tokens=4, truncate_prompt_tokens=-1))
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.timeout(120)
def test_a_tiny_temperature_samples_at_vllms_floor_said_once(llm, caplog):
    """vLLM raises a temperature in (0, 0.01) to 0.01 with one warning: a
    whole ``generate`` of two choices and eight steps logs it once, and
    samples as 0.01 given outright does (same seeds, same tokens)."""
    with caplog.at_level("WARNING"):
        [tiny] = llm.generate(PROMPT, _greedy(temperature=0.001, n=2, seed=5, max_tokens=8))
    warned = [r for r in caplog.records if "temperature 0.001 is below 0.01" in r.getMessage()]
    assert len(warned) == 1
    [floor] = llm.generate(PROMPT, _greedy(temperature=0.01, n=2, seed=5, max_tokens=8))
    assert [c.token_ids for c in tiny.outputs] == [c.token_ids for c in floor.outputs]


@pytest.mark.timeout(120)
def test_truncate_prompt_tokens_above_max_model_len_is_refused(llm):
    """vLLM refuses a k above ``max_model_len`` up front, whatever the
    prompt's length (a short one, which k would leave whole, too); k equal
    to it is a truncation like any other (hand-worked: this prompt stays
    whole)."""
    short = [{"prompt_token_ids": [100, 101, 102]}]
    for k in (MAX_MODEL_LEN + 1, 10**6):
        with pytest.raises(ValueError, match=rf"truncate_prompt_tokens {k} is more than "
                                             rf"max_model_len {MAX_MODEL_LEN}"):
            llm.generate(short + [PROMPT], _greedy(max_tokens=4, truncate_prompt_tokens=k))
    assert not llm.engine.has_unfinished_requests()
    [whole] = llm.generate(short, _greedy(max_tokens=4, truncate_prompt_tokens=MAX_MODEL_LEN))
    assert whole.prompt_token_ids == [100, 101, 102]


@pytest.mark.timeout(120)
def test_text_reads_after_the_prompt_with_a_sentencepiece_tokenizer(tmp_path):
    """A SentencePiece decoder drops the leading space of the first token it
    decodes; vLLM decodes an output after its prompt, so an output whose
    first token begins a word begins with its space. The text is the same
    with stop strings (decoded token by token) and without (decoded once),
    and equals the reference: the prompt and output decoded together, less
    the prompt's own text."""
    path = save_sentencepiece_style(tmp_path)
    with LLM(model=path, device="cpu", max_model_len=64) as llm:
        tokenizer = llm.get_tokenizer()
        words = _greedy(max_tokens=6, allowed_token_ids=SPM_WORD_STARTS)
        [plain] = llm.generate("the cat", words)
        [stopped] = llm.generate("the cat", words.replaced(stop=["never"]))
    prompt, ids = plain.prompt_token_ids, plain.outputs[0].token_ids
    want = tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):]
    assert want.startswith(" ") and len(want.split()) == 6
    assert plain.outputs[0].text == stopped.outputs[0].text == want


@pytest.mark.timeout(120)
def test_spaces_between_special_tokens_as_vllms_detokenizer(tmp_path):
    """A WordPiece decoder spaces tokens apart, added ones too; with
    special tokens shown and ``spaces_between_special_tokens`` False, each
    added token right after another of the output is written bare. The
    text, decoded once (no stop strings) and token by token (a stop string
    never met), is vLLM's detokenizer's for the tokens sampled; the default
    (True) is transformers' decode of the output after the prompt."""
    from transformers import PreTrainedTokenizerFast

    from tests.helpers.wordpiece import CLS, SEP, X, save_wordpiece_model

    path = save_wordpiece_model(tmp_path)
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{path}/tokenizer.json")
    mixed = SamplingParams(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True,
                           skip_special_tokens=False, allowed_token_ids=[1, 2, CLS, SEP, X])
    with LLM(model=path, device="cpu", max_model_len=64) as llm:
        tokenizer = llm.get_tokenizer()
        outs = {(spaces, bool(stop)): llm.generate("the cat", mixed.replaced(
                    spaces_between_special_tokens=spaces, stop=stop))[0]
                for spaces in (True, False) for stop in ([], ["never"])}
    prompt, ids = outs[True, False].prompt_token_ids, outs[True, False].outputs[0].token_ids
    assert all(out.outputs[0].token_ids == ids for out in outs.values())
    added = {CLS, SEP, X}
    assert any(a in added and b in added for a, b in zip(ids, ids[1:]))  # some in a row
    spaced = hf.decode(prompt + ids, skip_special_tokens=False)[len(hf.decode(
        prompt, skip_special_tokens=False)):]
    bare = vllm_fast_text(tokenizer.hf, prompt, ids, False, False)
    assert bare != spaced == vllm_fast_text(tokenizer.hf, prompt, ids, False, True)
    for (spaces, _), out in outs.items():
        assert out.outputs[0].text == (spaced if spaces else bare)


@pytest.mark.timeout(300)
def test_max_tokens_none_fills_the_context(llm):
    prompt = {"prompt_token_ids": list(range(3, 13))}
    [out] = llm.generate(prompt, _greedy(max_tokens=None))
    c = out.outputs[0]
    assert len(c.token_ids) == MAX_MODEL_LEN - 10 and c.finish_reason == "length"


@pytest.mark.timeout(120)
def test_assigned_fields_as_vllms_example_script(llm):
    """vLLM's offline example: the default params, then fields assigned. The
    tokens are those of the same params constructed at once; a broken
    assignment is a ValueError from generate, and the LLM goes on."""
    prompt = {"prompt_token_ids": list(range(3, 13))}
    params = llm.get_default_sampling_params()
    params.max_tokens, params.temperature, params.stop_token_ids = 5, 0.0, None
    [out] = llm.generate(prompt, params)
    [ref] = llm.generate(prompt, _greedy(max_tokens=5))
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert len(out.outputs[0].token_ids) == 5
    params.top_p = 1.5
    with pytest.raises(ValueError, match="top_p"):
        llm.generate(prompt, params)
    params.top_p = 1.0
    assert llm.generate(prompt, params)[0].outputs[0].token_ids == ref.outputs[0].token_ids


@pytest.mark.timeout(120)
def test_assignments_after_submitting_do_not_reach_the_request(llm):
    """``LLMEngine.add_request`` (vLLM's) takes the caller's params and the
    engine works on its own checked copy: assignments made after it, to
    fields and inside the caller's ``logit_bias`` dict, before the request's
    first step, leave the request as submitted. A bias of 100 on token 65
    makes every greedy token 65, for all six ``max_tokens``."""
    engine = llm.engine
    prompt = {"prompt_token_ids": list(range(3, 13))}

    def params() -> SamplingParams:
        return _greedy(max_tokens=6, logit_bias={65: 100.0})

    [ref] = llm.generate(prompt, params())
    assert ref.outputs[0].token_ids == [65] * 6
    submitted = params()
    request = engine.add_request(prompt, submitted)
    submitted.logit_bias[65] = -100.0
    submitted.max_tokens, submitted.temperature = 2, 1.0
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for d in engine.step() if d.req_id == request.req_id
                   for t in d.new_token_ids]
    assert tokens == [65] * 6


@pytest.mark.timeout(120)
def test_the_callers_params_are_checked_once(llm, monkeypatch):
    """``SamplingParams.checked`` (the copy a caller's params are checked
    in) runs once per params given, on ``LLM.generate`` (one params for
    every prompt: once; one a prompt: once each; ``n`` choices of it: once)
    and on ``LLMEngine.add_request``; the engine works on that copy."""
    calls = []
    checked = SamplingParams.checked

    def counted(self):
        calls.append(self)
        return checked(self)

    monkeypatch.setattr(SamplingParams, "checked", counted)
    prompt = {"prompt_token_ids": list(range(3, 13))}
    llm.generate([prompt] * 3, _greedy(max_tokens=2))
    assert len(calls) == 1
    llm.generate([prompt] * 2, [_greedy(max_tokens=2), _greedy(max_tokens=3)])
    assert len(calls) == 3
    [out] = llm.generate(prompt, _greedy(max_tokens=2, n=3, temperature=1.0))
    assert len(calls) == 4 and len(out.outputs) == 3
    llm.engine.add_request(prompt, _greedy(max_tokens=2))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert len(calls) == 5


@pytest.mark.timeout(300)
def test_max_tokens_past_the_context_ends_at_it(llm):
    """As vLLM's LLM (its HTTP server refuses instead): the request runs and
    ends at max_model_len with "length", min_tokens too cut to the context;
    its tokens are those of the request that asked for just what fits."""
    prompt = {"prompt_token_ids": list(range(3, 13))}
    fits = MAX_MODEL_LEN - 10
    [ref] = llm.generate(prompt, _greedy(max_tokens=fits))
    outs = llm.generate([prompt, prompt], [_greedy(max_tokens=fits + 50),
                                           _greedy(max_tokens=500, min_tokens=400)])
    for out in outs:
        c = out.outputs[0]
        assert c.token_ids == ref.outputs[0].token_ids and c.finish_reason == "length"
    with pytest.raises(ValueError, match=f"prompt \\({MAX_MODEL_LEN} tokens\\) leaves no room"):
        llm.generate({"prompt_token_ids": [3] * MAX_MODEL_LEN}, _greedy())


@pytest.mark.timeout(300)
def test_cumulative_logprob_sums_the_tokens_logprobs(llm):
    [plain] = llm.generate(PROMPT, _greedy(max_tokens=5))
    assert plain.outputs[0].cumulative_logprob is None
    [out] = llm.generate(PROMPT, _greedy(max_tokens=5, logprobs=2, stop=["never-here"]))
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 5
    picked = [entry[token].logprob for token, entry in zip(c.token_ids, c.logprobs)]
    assert all(lp <= 0.0 for lp in picked)
    assert c.cumulative_logprob == pytest.approx(sum(picked))


@pytest.mark.timeout(300)
def test_prompts_from_a_generator(llm):
    prompts = [PROMPT, {"prompt_token_ids": [4, 5, 6]}]
    listed = llm.generate(prompts, _greedy(max_tokens=4))
    generated = llm.generate((p for p in prompts), _greedy(max_tokens=4))
    assert [o.outputs[0].token_ids for o in generated] == [o.outputs[0].token_ids
                                                           for o in listed]


@pytest.mark.timeout(300)
def test_chat_renders_as_transformers(llm, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path)))
    chats = [[{"role": "user", "content": "Hi there"}],
             [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]]
    outputs = llm.chat(chats, _greedy(max_tokens=4))
    for chat, out in zip(chats, outputs):
        plain = [{**m, "content": m["content"] if isinstance(m["content"], str)
                  else m["content"][0]["text"]} for m in chat]
        ids = list(hf.apply_chat_template(plain, add_generation_prompt=True, tokenize=True,
                                          return_dict=False))
        assert out.prompt_token_ids == ids
        assert out.prompt == hf.apply_chat_template(plain, add_generation_prompt=True,
                                                    tokenize=False)
        [ref] = llm.generate({"prompt_token_ids": ids}, _greedy(max_tokens=4))
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    [one] = llm.chat(chats[0], _greedy(max_tokens=4))  # one chat, not a list of them
    assert one.prompt_token_ids == outputs[0].prompt_token_ids


# Short enough for MAX_MODEL_LEN: the tools as JSON, then the messages' texts.
TOOLS_TEMPLATE = ("{{ tools | tojson if tools else '-' }}"
                  "{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.timeout(300)
def test_chat_renders_tools_as_transformers(llm, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path)))
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = [{"role": "user", "content": "Hi"}]
    [out] = llm.chat(chat, _greedy(max_tokens=4), chat_template=TOOLS_TEMPLATE, tools=tools)
    assert out.prompt == hf.apply_chat_template(chat, tools=tools, tokenize=False,
                                                chat_template=TOOLS_TEMPLATE)
    assert out.prompt_token_ids == list(hf.apply_chat_template(
        chat, tools=tools, tokenize=True, return_dict=False, chat_template=TOOLS_TEMPLATE))
    assert '"name": "f"' in out.prompt
    [plain] = llm.chat(chat, _greedy(max_tokens=4), chat_template=TOOLS_TEMPLATE)
    assert plain.prompt == "-Hi"


@pytest.mark.timeout(300)
def test_chat_takes_the_template_of_its_kwargs_as_transformers_does(llm, tmp_path):
    """A ``chat_template`` key in ``chat_template_kwargs`` is the template
    (transformers' ``apply_chat_template`` takes it so, as vLLM's
    ``LLM.chat`` hands it the kwargs); ``chat_template`` given wins; a key
    that is no text is refused naming ``chat_template_kwargs``."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path)))
    chat = [{"role": "user", "content": "Hi"}]
    kwargs = {"chat_template": "{% for m in messages %}<{{ m.content }}|{{ mood }}>{% endfor %}",
              "mood": "calm"}
    [out] = llm.chat(chat, _greedy(max_tokens=1), chat_template_kwargs=kwargs)
    assert out.prompt == hf.apply_chat_template(chat, tokenize=False, **kwargs) == "<Hi|calm>"
    [out] = llm.chat(chat, _greedy(max_tokens=1), chat_template=TOOLS_TEMPLATE,
                     chat_template_kwargs=kwargs)
    assert out.prompt == "-Hi"
    with pytest.raises(InvalidRequestError, match="template's text") as e:
        llm.chat(chat, _greedy(max_tokens=1), chat_template_kwargs={"chat_template": 3})
    assert e.value.param == "chat_template_kwargs"


@pytest.mark.timeout(300)
def test_chat_refuses_tools_nested_past_the_bound_before_rendering(llm):
    """A tool whose parameters nest 5000 levels (past Python's recursion
    limit, where the template's ``tojson`` would fail deep inside), or
    that holds itself, is refused up front, naming ``tools``."""
    from tests.engine.test_tool_depth import nested_schema, tool_with

    template = "{{ tools[0].function.parameters | tojson }}{{ messages[0].content }}"
    cyclic: dict = {"type": "object"}
    cyclic["properties"] = {"self": cyclic}
    chat = [{"role": "user", "content": "Hi"}]
    for parameters in (nested_schema(5000), cyclic):
        with pytest.raises(InvalidRequestError, match="tools.0 nests") as e:
            llm.chat(chat, _greedy(max_tokens=1), chat_template=template,
                     tools=[tool_with(parameters)])
        assert e.value.param == "tools"
    [out] = llm.chat(chat, _greedy(max_tokens=1), chat_template=template,
                     tools=[tool_with(nested_schema(3))])  # the engine goes on
    assert out.prompt == '{"items": {"items": {}}}Hi'


@pytest.mark.timeout(300)
def test_allowed_ids_and_bias_follow_transformers_logits(tmp_path):
    """Greedy with ``allowed_token_ids`` and ``logit_bias`` against a loop
    over transformers' logits with the rule applied by hand."""
    import torch

    from tests.helpers.hf_models import save_with_greedy_reference, small_llama

    model = small_llama(1, 128, num_attention_heads=4, num_key_value_heads=2)
    prompt = [3, 14, 15, 92, 65]
    save_with_greedy_reference(model, tmp_path, [prompt], 1)
    allowed = [7, 21, 40, 41, 90, 100]
    bias = {40: 30.0, 90: -30.0, 5: 50.0}  # 5 is not allowed: it stays out
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            logits = model(torch.tensor([tokens])).logits[0, -1].double()
            ruled = {t: logits[t].item() + bias.get(t, 0.0) for t in allowed}
            tokens.append(max(ruled, key=ruled.get))
    with LLM(model=str(tmp_path), device="cpu") as llm:
        [out] = llm.generate({"prompt_token_ids": prompt},
                             _greedy(max_tokens=6, allowed_token_ids=allowed, logit_bias=bias))
    assert out.outputs[0].token_ids == tokens[len(prompt):]


@pytest.mark.timeout(300)
def test_skip_special_tokens_false_shows_them_as_transformers_decodes(llm, tmp_path):
    from transformers import AutoTokenizer

    from checkpoint.tiny_model import EOS

    hf = AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path)))
    forced = {EOS: 100.0}  # a special token, not a stop here (ignore_eos)
    for stop in ([], ["never-here"]):  # decoded at the end, and token by token
        outs = [llm.generate(PROMPT, _greedy(max_tokens=3, logit_bias=forced, stop=stop,
                                             skip_special_tokens=skip))[0].outputs[0]
                for skip in (True, False)]
        assert outs[0].token_ids == outs[1].token_ids == [EOS] * 3
        assert outs[0].text == hf.decode([EOS] * 3, skip_special_tokens=True) == ""
        assert outs[1].text == hf.decode([EOS] * 3, skip_special_tokens=False) != ""


@pytest.mark.timeout(120)
def test_vllm_constructor_spellings(llm, tmp_path, monkeypatch):
    """What vLLM scripts pass: ``trust_remote_code`` and ``swap_space`` are
    taken (tprun runs no model code; vLLM's V1 engine swaps nothing), dtype
    "half" is float16, ``llm_engine`` is the engine, the tokenizer renders a
    chat as ``LLM.chat`` prompts it; a value of a vLLM option that asks for
    what tprun does not do is a ValueError naming it, and an option tprun
    does not have at all a TypeError naming it."""
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    with pytest.raises(TypeError, match=r"'cpu_offload_gb', 'kv_transfer_config'.*not an option"):
        LLM(model="tiny", device="cpu", kv_transfer_config={}, cpu_offload_gb=4)
    with pytest.raises(ValueError, match=r"^quantization 'awq' is not supported"):
        LLM(model="tiny", device="cpu", quantization="awq", swap_space=4)
    with LLM(model="tiny", device="cpu", dtype="half", trust_remote_code=True, swap_space=4,
             max_model_len=MAX_MODEL_LEN) as half:
        assert half.llm_engine is half.engine
        assert half.engine.config.dtype == "float16"
    messages = [{"role": "user", "content": "Hi"}]
    text = llm.get_tokenizer().apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=True)
    params = _greedy(max_tokens=4)
    want = llm.chat(messages, params)[0]
    got = llm.generate({"prompt_token_ids": llm.get_tokenizer().apply_chat_template(
        messages, add_generation_prompt=True)}, params)[0]
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert llm.get_tokenizer().encode(text, add_special_tokens=False) == want.prompt_token_ids


@pytest.mark.timeout(120)
def test_logprobs_carry_each_candidates_text(llm):
    """vLLM's ``Logprob.decoded_token``: each candidate's id decoded alone
    by transformers' tokenizer of the model, for the output's logprobs and
    the prompt's."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(llm.engine.model_dir)
    out = llm.generate(PROMPT, _greedy(max_tokens=4, logprobs=2, prompt_logprobs=1))[0]
    entries = [e for e in out.prompt_logprobs if e is not None] + out.outputs[0].logprobs
    assert len(entries) == len(out.prompt_token_ids) - 1 + 4
    for entry in entries:
        assert all(lp.decoded_token == hf.decode([t]) for t, lp in entry.items())
    assert any(lp.decoded_token.strip() for e in entries for lp in e.values())


@pytest.mark.timeout(120)
def test_detokenize_false_gives_ids_only_and_decodes_nothing(llm, monkeypatch):
    """vLLM's ``detokenize=False``: the same token ids and logprobs, an
    empty text, every ``decoded_token`` None (output's and prompt's), and no
    decode of the tokenizer's at all (counted); the reference is the same
    request with ``detokenize`` on, and the tokenizer's decode of its ids."""
    params = _greedy(max_tokens=5, logprobs=2, prompt_logprobs=1, n=2, temperature=0.8, seed=4)
    tokenizer = llm.get_tokenizer()
    decode, calls = tokenizer.decode, []
    monkeypatch.setattr(tokenizer, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    [shown] = llm.generate(PROMPT, params)
    assert calls  # the counter sees the decodes of a detokenized output
    calls.clear()
    [bare] = llm.generate(PROMPT, params.replaced(detokenize=False))
    assert not calls
    for got, want in zip(bare.outputs, shown.outputs):
        assert want.text == tokenizer.decode(want.token_ids) != ""
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, "", "length")
        assert [{t: lp.logprob for t, lp in e.items()} for e in got.logprobs] == \
            [{t: lp.logprob for t, lp in e.items()} for e in want.logprobs]
        assert all(lp.decoded_token is None for e in got.logprobs for lp in e.values())
    assert bare.prompt_token_ids == shown.prompt_token_ids
    assert all(lp.decoded_token is None for e in bare.prompt_logprobs if e is not None
               for lp in e.values())


@pytest.mark.timeout(120)
def test_reset_prefix_cache_forgets_the_prompts(llm):
    """vLLM's ``reset_prefix_cache``: a prompt run again finds its blocks
    cached, not after a reset (and again after that run); refused (False)
    while a request is unfinished, which then still finds its blocks."""
    prompt = {"prompt_token_ids": list(range(3, 43))}  # two full blocks and more
    params = _greedy(max_tokens=2)
    cached = [llm.generate(prompt, params)[0].num_cached_tokens for _ in range(2)]
    assert llm.reset_prefix_cache()
    cached += [llm.generate(prompt, params)[0].num_cached_tokens for _ in range(2)]
    assert cached == [0, 32, 0, 32]
    request = llm.engine.add_request(prompt, params)
    assert not llm.reset_prefix_cache()
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert request.num_cached_tokens == 32


@pytest.mark.timeout(300)
def test_metrics_time_each_output_and_count_its_tokens(llm):
    """vLLM's ``RequestOutput.metrics``: arrival, queueing, first
    scheduling, first and last token in order within the call; the tokens
    of every choice counted (n=3), and of a choice cut at a stop string
    only those it kept."""
    text = llm.generate(PROMPT, _greedy(max_tokens=8))[0].outputs[0].text
    params = [_greedy(max_tokens=6),
              SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True),
              _greedy(max_tokens=8, stop=[text[3:5]])]
    with Window() as window:
        outs = llm.generate([PROMPT] * 3, params)
    stopped = outs[2].outputs[0]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) < 8
    assert [o.metrics.num_generation_tokens for o in outs] == [6, 15, len(stopped.token_ids)]
    for out in outs:
        assert_in_order(out, window, engine_side=True)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_generate_returns_final_outputs_whatever_the_output_kind(llm, kind):
    """As vLLM's LLM: output_kind is for streaming callers; generate's
    outputs are whole and finished for each of the three."""
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    want = llm.generate("Hello", greedy)[0].outputs[0]
    got = llm.generate("Hello", greedy.replaced(output_kind=kind))[0]
    assert got.finished
    assert (got.outputs[0].text, got.outputs[0].token_ids) == (want.text, want.token_ids)
    assert len(want.token_ids) == 6
