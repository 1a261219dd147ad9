"""What ``tprun generate`` prints: one line per completion, in the order of
the prompts and, within a prompt, of its ``--n`` completions.

``--json``: one object a line, ``{"index", "prompt_token_ids", "token_ids",
"text", "finish_reason"}`` (``index``: the prompt's); with ``--n`` above 1,
also ``"choice"`` (the completion's, 0 to n-1); with ``--logprobs``, also
``"logprobs"``, one list per output token of ``[token_id, logprob, rank]``
triples (the N most likely tokens by rank, then the sampled token where it
is not among them; a token a constraint masks, logprob -inf, which JSON
cannot carry, shows -9999.0, as the HTTP server and vLLM's show it), and
``"cumulative_logprob"`` (the sampled tokens' logprobs summed). Plain: ``[index] prompt -> text (finish_reason)``, the
index ``index.choice`` with ``--n`` above 1, and the cumulative logprob
after the finish reason with ``--logprobs``.
"""

from __future__ import annotations

import json


def output_lines(outputs: list, as_json: bool) -> list[str]:
    """The lines of ``outputs`` (``RequestOutput``s, one a prompt)."""
    lines = []
    for i, out in enumerate(outputs):
        several = len(out.outputs) > 1
        for completion in out.outputs:
            line = _json_line if as_json else _plain_line
            lines.append(line(i, out, completion, several))
    return lines


def _json_line(i: int, out, completion, several: bool) -> str:
    obj = {"index": i, "prompt_token_ids": out.prompt_token_ids,
           "token_ids": completion.token_ids, "text": completion.text,
           "finish_reason": completion.finish_reason}
    if several:
        obj["choice"] = completion.index
    if completion.logprobs is not None:
        from serving.http.logprobs import shown

        obj["logprobs"] = [[[token_id, shown(p.logprob), p.rank] for token_id, p in step.items()]
                           for step in completion.logprobs]
        obj["cumulative_logprob"] = completion.cumulative_logprob
    return json.dumps(obj)


def _plain_line(i: int, out, completion, several: bool) -> str:
    shown = out.prompt if out.prompt is not None else out.prompt_token_ids
    index = f"{i}.{completion.index}" if several else f"{i}"
    ending = completion.finish_reason
    if completion.cumulative_logprob is not None:
        ending += f", cumulative logprob {completion.cumulative_logprob:.4f}"
    return f"[{index}] {shown!r} -> {completion.text!r} ({ending})"
