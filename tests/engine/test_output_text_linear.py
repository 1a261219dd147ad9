"""``LLM``'s output text and logprobs are not copied whole for each token
(``engine.output_text.OutputText``): a long output fed one token a step
through its stop strings, the memory each step allocates at its peak
(``tracemalloc``, no clock), summed, about doubles when the output does,
where copying the text or the logprobs so far at each step would
quadruple it. The text is the whole output's decode, the logprobs one
per token, in order."""

from __future__ import annotations

import pytest

from checkpoint.tokenizer import Tokenizer, output_text
from engine.output_text import OutputText
from engine.outputs import Logprob, RequestOutputDelta
from engine.sampling_params import SamplingParams
from tests.helpers.allocations import Allocations


@pytest.mark.parametrize("logprobs", [False, True], ids=["text", "text and logprobs"])
def test_an_output_is_not_copied_per_token(tiny_dir, logprobs):
    tokenizer = Tokenizer.from_dir(tiny_dir)
    prompt = tokenizer.encode("Once")
    allocated = []
    for n in (150, 300):
        ids = tokenizer.encode("the quick brown fox " * n)
        out, count = OutputText(tokenizer, prompt, SamplingParams(stop=["never met"])), Allocations()
        with count.tracing():
            for i, token in enumerate(ids):
                last = i == len(ids) - 1
                delta = RequestOutputDelta(
                    "r", [token], last, "length" if last else None,
                    [{token: Logprob(-0.5, 1)}] if logprobs else None)
                with count.piece():
                    out.add(delta)
                    if last:
                        out.finish(delta)
        assert out.text == output_text(tokenizer, prompt, ids, True, True)
        assert out.token_ids == ids
        assert out.logprobs == ([{t: Logprob(-0.5, 1, tokenizer.decode([t], False))}
                                 for t in ids] if logprobs else None)
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated
