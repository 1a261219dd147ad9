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
in U+FFFD itself, vLLM's primed stream has released nothing yet, so its
first piece begins with the prompt's whole text (prompt "x" and the first
two bytes of "\u20ac", output its last byte: "x\u20ac"). tprun's text is
what the prompt and output decoded together add after the prompt's text
("\u20ac": the character the prompt began, completed), and this reference
cuts so: from that first piece, the start it shares with the prompt's text.
"""

from __future__ import annotations


def _shared_start(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` begin with alike."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def vllm_fast_pieces(hf, prompt_ids: list[int], output_ids: list[int],
                     skip_special_tokens: bool = True,
                     spaces_between_special_tokens: bool = True) -> list[str]:
    """Each output token's piece of text (``hf``: a ``tokenizers.Tokenizer``)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=skip_special_tokens)
    prompt_text = hf.decode(list(prompt_ids), skip_special_tokens=skip_special_tokens)
    # The prompt's text the stream's first piece begins with (the difference above).
    held = prompt_text if prompt_text.endswith("\ufffd") else None
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    bare = not skip_special_tokens and not spaces_between_special_tokens
    pieces, after_added = [], False
    for token in output_ids:
        piece = stream.step(hf, token) or ""
        if piece and held is not None:
            piece, held = piece[_shared_start(piece, held):], None
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
