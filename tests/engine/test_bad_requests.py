"""Invalid requests: a ValueError that says what is wrong, raised before
anything is scheduled; the engine keeps serving the others."""

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import os

    os.environ.setdefault("TPRUN_CACHE", str(tmp_path_factory.mktemp("cache")))
    with LLM(model="tiny", device="cpu", max_model_len=128) as llm:
        yield llm


GOOD = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize("prompt,params,message", [
    ("", GOOD, "prompt is empty"),
    ({"prompt_token_ids": []}, GOOD, "prompt is empty"),
    ({"prompt_token_ids": [1, 5000]}, GOOD, "outside the vocabulary"),
    ({"prompt_token_ids": [-1]}, GOOD, "outside the vocabulary"),
    # A prompt that leaves no room for a token (a longer max_tokens alone is
    # cut to the context, as vLLM's LLM cuts it: test_llm_api.py): the
    # prompt is blamed, not a max_tokens the context cut.
    ({"prompt_token_ids": list(range(1, 129))}, SamplingParams(max_tokens=20),
     r"^the prompt \(128 tokens\) leaves no room for output in max_model_len 128"),
    ({"prompt_token_ids": list(range(1, 200))}, SamplingParams(max_tokens=20),
     r"^the prompt \(199 tokens\) leaves no room for output in max_model_len 128"),
    ({"prompt_tokens": [1]}, GOOD, "a prompt is"),
    ({"prompt_token_ids": "123"}, GOOD, "prompt_token_ids must be a list of ints"),
    ({"prompt_token_ids": 5}, GOOD, "prompt_token_ids must be a list of ints"),
    ({"prompt_token_ids": [1.9, 2]}, GOOD, "prompt_token_ids must be ints, got 1.9"),
    ({"prompt_token_ids": [True]}, GOOD, "prompt_token_ids must be ints, got True"),
    ({"prompt_token_ids": [[1, 2]]}, GOOD, r"prompt_token_ids must be ints, got \[1, 2\]"),
    ("hi", SamplingParams(max_tokens=2, logprobs=21), "logprobs 21 is more than max_logprobs 20"),
    ("hi", SamplingParams(max_tokens=2, logit_bias={3: 1.0, 5000: 2.0}),
     r"logit_bias token ids \[5000\] are outside the vocabulary"),
    ("hi", SamplingParams(max_tokens=2, allowed_token_ids=[7, 9999]),
     r"allowed_token_ids token ids \[9999\] are outside the vocabulary"),
])
@pytest.mark.timeout(60)
def test_bad_prompt_is_rejected_and_engine_keeps_serving(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine", prompt], params)
    assert not llm.engine.has_unfinished_requests()  # nothing was scheduled
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], GOOD)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_p=2.0), "min_p"),
])
def test_invalid_sampling_params_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_sampling_field_is_named():
    with pytest.raises(ValueError, match="tempurature"):
        SamplingParams.from_dict({"tempurature": 0.5})
    with pytest.raises(TypeError):
        SamplingParams(tempurature=0.5)
