"""vLLM's detokenizer of a fast tokenizer written out over tokenizers'
``DecodeStream``, the reference for an output's text and its pieces.

vLLM primes one stream with the whole prompt (``DecodeStream(ids=prompt)``),
steps it through the output one token at a time, and adds what each step
returns (nothing for a step that returns None: the text so far ends in
U+FFFD, so the stream holds those tokens back). When the request ends it
adds nothing more: what the stream still holds is never shown. With special
tokens shown and ``spaces_between_special_tokens`` False, a step whose token
is an added token (special or not) right after another of the output adds
that token's own text instead.

The one difference, which tprun keeps on purpose (README, "An output's
text"): where the prompt's text (decoded as the request decodes) ends in
U+FFFD, a token-id prompt that ends inside a character or a text that ends
in U+FFFD itself, vLLM's primed stream has no prefix yet, so its first
piece would begin with the prompt's whole text (prompt "\\ufffd", output
"a": "\\ufffda"), text that is the prompt's, not the output's. tprun
decodes such an output as if there were no prompt, and so does this
reference: the stream starts empty there.
"""

from __future__ import annotations


def _primer(hf, prompt_ids: list[int], skip_special_tokens: bool) -> list[int]:
    """The ids the stream starts from: the prompt, or none where its text
    ends in U+FFFD (the documented difference above)."""
    text = hf.decode(list(prompt_ids), skip_special_tokens=skip_special_tokens)
    return [] if text.endswith("\ufffd") else list(prompt_ids)


def vllm_fast_pieces(hf, prompt_ids: list[int], output_ids: list[int],
                     skip_special_tokens: bool = True,
                     spaces_between_special_tokens: bool = True) -> list[str]:
    """Each output token's piece of text (``hf``: a ``tokenizers.Tokenizer``)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=_primer(hf, prompt_ids, skip_special_tokens),
                          skip_special_tokens=skip_special_tokens)
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    bare = not skip_special_tokens and not spaces_between_special_tokens
    pieces, after_added = [], False
    for token in output_ids:
        piece = stream.step(hf, token) or ""
        if bare and token in added and after_added:
            piece = added[token]
        after_added = token in added
        pieces.append(piece)
    return pieces


def vllm_fast_text(hf, prompt_ids: list[int], output_ids: list[int],
                   skip_special_tokens: bool = True,
                   spaces_between_special_tokens: bool = True) -> str:
    """The output's whole text: its pieces joined."""
    return "".join(vllm_fast_pieces(hf, prompt_ids, output_ids, skip_special_tokens,
                                    spaces_between_special_tokens))
