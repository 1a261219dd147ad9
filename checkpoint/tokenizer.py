"""Text <-> token ids, from a model directory's ``tokenizer.json``.

BOS: when ``tokenizer_config.json`` has ``add_bos_token``, that flag alone
decides (the tokenizer's own post-processor is bypassed, so BOS is never
doubled). When the key is absent, ``tokenizer.json``'s post-processor
decides, as in Hugging Face (a plain byte-level tokenizer adds nothing).
``decode`` skips special tokens unless told not to (vLLM's
``skip_special_tokens``). An output's text shows them as vLLM's detokenizer
of a fast tokenizer does: as the decoder writes them, or, with
``spaces_between_special_tokens`` False (and ``skip_special_tokens``
False), each added token that follows another added token of the output
as its bare text, without the space a decoder that spaces tokens apart
(WordPiece's; no decoder at all) puts before it (``_text_with_bare_added``).

``LLM.get_tokenizer()`` returns a ``Tokenizer``, where vLLM returns a
transformers tokenizer: so it also answers to the transformers names
scripts use most (``apply_chat_template``, ``convert_ids_to_tokens``,
``convert_tokens_to_ids``, ``get_vocab``, ``len()``, ``batch_decode``,
``bos_token`` / ``eos_token``), with transformers' results, and its
``decode`` takes what a transformers fast tokenizer's takes (one id, a
batch, an array; ``clean_up_tokenization_spaces``; other keywords, such as
``spaces_between_special_tokens``, change nothing there and here).

An output's text is the decoder's own (``raw_decode``, no clean-up), as
vLLM's detokenizer of a fast tokenizer (tokenizers' ``DecodeStream``)
writes it, token by token: a token's text is released once the text so far
does not end in U+FFFD, and what is still held back when the output ends
(an incomplete UTF-8 character, a token that is U+FFFD itself) is never
shown. An output's text is what the prompt and output decoded together add
after the prompt's own text (``_text_added``): after a prompt that ends
inside a character, the output's first text completes that character, which
the prompt's text held back (vLLM's stream, which has released nothing of
such a prompt, would begin the output with the prompt's whole text).
"""

from __future__ import annotations

import json
import os
from typing import Any

import tokenizers

from checkpoint.chat_template import chat_prompt_ids
from checkpoint.growing_text import GrowingText
from ipc.errors import InvalidRequestError

# Tokens of prompt context the incremental detokenizer starts from: enough
# for decoders that drop a leading space on the first token they see.
_CONTEXT_TOKENS = 5
# The most tokens the context takes beyond those to begin where a character
# begins: a UTF-8 character is at most four bytes, a token at least one.
_CHARACTER_TOKENS = 3
# The most tokens one character's bytes lie in (``_ends_held``).
_TAIL_TOKENS = _CHARACTER_TOKENS + 1
# The tokens the last of ``_ends_held``'s windows reads: four of them, each
# starting a token earlier than the one before.
_TAIL_WINDOW_TOKENS = 2 * _TAIL_TOKENS - 1


def _token_text(entry: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or as an
    AddedToken dict with a "content" field."""
    if isinstance(entry, dict):
        return entry.get("content")
    return entry if isinstance(entry, str) else None


def _read_json(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` ({} when there is no such file);
    ValueError naming the file when it does not hold one."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the BOS/EOS facts the engine needs,
    and tokenizer_config.json's clean-up flags, which transformers' decode
    reads (``decode``; the output text never reads them)."""

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        add_bos_token: bool | None = None,
        chat_template: str | None = None,
        clean_up_tokenization_spaces: bool = False,
        clean_up_bpe: bool = False,
        pad_token_id: int | None = None,
    ) -> None:
        self.hf = hf_tokenizer
        # transformers' names and defaults: whether ``decode`` cleans up by
        # default, and whether it does so for a BPE model too.
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._cleans_up = clean_up_bpe or type(hf_tokenizer.model).__name__ != "BPE"
        # A Jinja2 template (transformers' convention) that renders a list of
        # chat messages into a prompt; None when the model ships none.
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        # The padding token (tokenizer_config.json's ``pad_token``; None where
        # it names none): what vLLM counts between a scored pair's two texts.
        self.pad_token_id = pad_token_id
        self.add_bos_token = add_bos_token
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        added = hf_tokenizer.get_added_tokens_decoder()
        # The ids ``decode`` drops under ``skip_special_tokens``.
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        # Every added token's text by id, special or not: the text an added
        # token after another shows without ``spaces_between_special_tokens``.
        self.added_texts = {i: t.content for i, t in added.items()}
        if add_bos_token and bos_token_id is None:
            raise ValueError("add_bos_token is set but the tokenizer has no bos_token")

    @classmethod
    def from_dir(cls, model_dir: str) -> Tokenizer:
        """The tokenizer of ``model_dir``; ValueError naming the file for a
        missing or unreadable one (a fault of the model the user names)."""
        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(
                f"no tokenizer.json in {model_dir!r}: tprun needs a Hugging Face fast "
                f"tokenizer file (save one with tokenizer.save_pretrained)"
            )
        try:
            hf = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception)
            raise ValueError(f"cannot read {path}: {e}") from None
        config = _read_json(os.path.join(model_dir, "tokenizer_config.json"))
        special = _read_json(os.path.join(model_dir, "special_tokens_map.json"))

        def token_id(name: str) -> int | None:
            text = _token_text(config.get(name)) or _token_text(special.get(name))
            return None if text is None else hf.token_to_id(text)

        add_bos = config.get("add_bos_token")
        return cls(
            hf,
            bos_token_id=token_id("bos_token"),
            eos_token_id=token_id("eos_token"),
            pad_token_id=token_id("pad_token"),
            add_bos_token=None if add_bos is None else bool(add_bos),
            chat_template=config.get("chat_template"),
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
            clean_up_bpe=bool(config.get(
                "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's ids; with ``add_special_tokens`` False, no BOS or other
        token the post-processor would add (the text's own tokens only).
        ``InvalidRequestError`` for a text that is not Unicode text (a lone
        surrogate), which the tokenizer cannot read."""
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidRequestError(f"the text is not valid Unicode: {e.reason} at "
                                          f"character {e.start}") from None
        if not add_special_tokens:
            return self._ids(text, add_special_tokens=False)
        if self.add_bos_token is None:
            return self._ids(text, add_special_tokens=True)
        ids = self._ids(text, add_special_tokens=False)
        if self.add_bos_token:
            ids = [self.bos_token_id, *ids]
        return ids

    def encode_pair(self, text_1: str, text_2: str, max_length: int | None = None) -> list[int]:
        """The ids of a text pair as transformers' fast tokenizer encodes
        ``tokenizer(text=text_1, text_pair=text_2)`` (a cross-encoder's
        prompt): the tokenizer's pair template where tokenizer_config.json
        leaves ``add_bos_token`` unset; else each text after a BOS where it
        is set (transformers' Llama pair template), the bare texts where it
        is off. ``max_length``: at most that many ids, as
        ``truncation=True, max_length=...`` cuts a pair (``pair_lengths``:
        the longer text first, from its end; the special tokens kept).
        ``InvalidRequestError`` as ``encode``, and for a ``max_length``
        below the special tokens' count."""
        for text in (text_1, text_2):
            self.encode(text, add_special_tokens=False)  # the Unicode check
        if self.add_bos_token is None:
            if max_length is None:
                return self.hf.encode_batch([(text_1, text_2)], add_special_tokens=True)[0].ids
            one, two = self.hf.encode_batch([text_1, text_2], add_special_tokens=False)
            n1, n2 = pair_lengths(len(one.ids), len(two.ids), max_length,
                                  self.hf.num_special_tokens_to_add(True))
            one.truncate(n1)
            two.truncate(n2)
            return self.hf.post_process(one, two, add_special_tokens=True).ids
        ids_1 = self._ids(text_1, add_special_tokens=False)
        ids_2 = self._ids(text_2, add_special_tokens=False)
        bos = [self.bos_token_id] if self.add_bos_token else []
        if max_length is not None:
            n1, n2 = pair_lengths(len(ids_1), len(ids_2), max_length, 2 * len(bos))
            ids_1, ids_2 = ids_1[:n1], ids_2[:n2]
        return [*bos, *ids_1, *bos, *ids_2]

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        """``hf.encode``'s ids, through ``encode_batch`` of the one text: the
        same ids, but tokenizers releases the GIL while it works (``encode``
        holds it throughout), so a long text tokenized in a thread (the
        engine endpoint's tokenizer threads, the HTTP front end's) leaves
        the process's other threads running."""
        return self.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def raw_decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """The decoder's text of ``token_ids``, with no clean-up: what an
        output's text is made of."""
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def decode(self, token_ids: Any, skip_special_tokens: bool = True,
               clean_up_tokenization_spaces: bool | None = None, **kwargs: Any) -> str | list[str]:
        """The text of ``token_ids`` as transformers' fast tokenizer decodes
        it, but for the default of ``skip_special_tokens`` (True, vLLM's).
        ``token_ids``: a list of ids, one id, a list of lists (a list of
        texts back), or an array or tensor (``tolist()``).
        ``clean_up_tokenization_spaces`` (None: tokenizer_config.json's,
        False where it has none) removes the space before punctuation and
        English contractions (transformers' ``clean_up_tokenization``),
        except for a BPE model, which transformers leaves as it is unless
        the config forces it. Other keyword arguments
        (``spaces_between_special_tokens``: a fast tokenizer has no such
        option) change nothing, as in transformers."""
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
        if isinstance(ids, dict):  # a BatchEncoding
            ids = ids["input_ids"]
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(seq, skip_special_tokens, clean_up_tokenization_spaces)
                    for seq in ids]
        text = self.raw_decode(ids, skip_special_tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return _cleaned_up(text) if clean_up_tokenization_spaces and self._cleans_up else text

    def token_text(self, token_id: int | None) -> str | None:
        """The text of one token id (special tokens included), e.g. for a
        chat template's ``bos_token`` / ``eos_token`` variables."""
        return None if token_id is None else self.hf.id_to_token(token_id)

    # ---- transformers' names -------------------------------------------
    @property
    def bos_token(self) -> str | None:
        return self.token_text(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self.token_text(self.eos_token_id)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.hf.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | None | list[str | None]:
        if isinstance(ids, int):
            return self.hf.id_to_token(ids)
        return [self.hf.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.hf.token_to_id(tokens)
        return [self.hf.token_to_id(t) for t in tokens]

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None,
                     **kwargs: Any) -> list[str]:
        """Each sequence decoded (transformers' default keeps special tokens)."""
        sequences = sequences.tolist() if hasattr(sequences, "tolist") else sequences
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces)
                for ids in sequences]

    def apply_chat_template(self, conversation: list[dict] | list[list[dict]],
                            tools: list[dict] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False,
                            continue_final_message: bool = False, tokenize: bool = True,
                            **template_vars: Any) -> str | list[int] | list:
        """transformers' ``apply_chat_template``: the prompt text of the
        messages (``tokenize`` False) or its ids (True: tokenized without
        adding special tokens, the template places them); a list of
        conversations gives a list. Other keyword arguments reach the
        template as variables; transformers' tensor and padding options are
        refused (this returns lists)."""
        refused = sorted(set(template_vars) & {"return_tensors", "return_dict", "padding",
                                               "truncation", "max_length"})
        if refused:
            raise TypeError(f"apply_chat_template does not take {', '.join(refused)} here "
                            f"(it returns the text or a list of ids)")
        if conversation and isinstance(conversation[0], list):
            return [self.apply_chat_template(c, tools, chat_template, add_generation_prompt,
                                             continue_final_message, tokenize, **template_vars)
                    for c in conversation]
        text, ids = chat_prompt_ids(self, conversation, add_generation_prompt=add_generation_prompt,
                                    chat_template=chat_template, extra=template_vars or None,
                                    continue_final_message=continue_final_message, tools=tools)
        return ids if tokenize else text


# transformers' ``clean_up_tokenization``: each space-led piece, and what it becomes.
_CLEAN_UPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
              (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleaned_up(text: str) -> str:
    for piece, replacement in _CLEAN_UPS:
        text = text.replace(piece, replacement)
    return text


def _context_ids(tokenizer: Tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool) -> list[int]:
    """The prompt's last tokens an output is decoded after. Under
    ``skip_special_tokens`` the last ones that decode to text: special
    tokens there would leave a context of nothing, and a SentencePiece
    decoder would then drop the output's leading space. Their text may end
    in U+FFFD (token ids that end inside a character): ``_text_added`` cuts
    off only the text the prompt keeps. Where their text begins with
    U+FFFD (the first of them inside a character, as where the prompt ends
    in characters written as byte tokens), up to ``_CHARACTER_TOKENS``
    more, to begin with a whole character: a byte-fallback decoder
    (SentencePiece's) reads a run of byte tokens that begins inside a
    character as U+FFFD throughout, the output's bytes after it too."""
    ids: list[int] = []
    tokens = reversed(prompt_token_ids)
    for token in tokens:
        if not (skip_special_tokens and token in tokenizer.special_ids):
            ids.append(token)
        if len(ids) == _CONTEXT_TOKENS:
            break
    for token in tokens:
        if len(ids) == _CONTEXT_TOKENS + _CHARACTER_TOKENS or not tokenizer.raw_decode(
                ids[::-1], skip_special_tokens).startswith("\ufffd"):
            break
        if not (skip_special_tokens and token in tokenizer.special_ids):
            ids.append(token)
    ids.reverse()
    return ids


def _text_added(head: str, joint: str) -> str | None:
    """The text ``joint`` (a context's tokens and more, decoded together)
    adds after ``head`` (the context's tokens decoded alone): what follows
    ``head`` where ``joint`` begins with it. Where ``head`` ends in U+FFFD
    that ``joint`` rewrites (the context ends inside a character that the
    tokens after it complete: "I like \ufffd", "I like \U0001f999 a"),
    what follows the start the two share, which holds all of ``head`` but
    its last U+FFFDs ("\U0001f999 a"): the text of ``joint`` less the
    context's, the character the context began belonging to the tokens
    that complete it. None where ``joint`` keeps less of ``head`` (a
    decoder that rewrites more than a cut character)."""
    if joint.startswith(head):
        return joint[len(head):]
    kept = head.rstrip("\ufffd")
    if len(kept) == len(head) or not joint.startswith(kept):
        return None
    shared = len(kept)
    while shared < len(joint) and joint[shared] == head[shared]:  # head is longer
        shared += 1
    return joint[shared:]


def _text_after(tokenizer: Tokenizer, context_ids: list[int], output_ids: list[int],
                skip_special_tokens: bool) -> str:
    """The text ``output_ids`` add after ``context_ids``: their joint decode
    less the context's own (a decoder that drops the leading space of the
    first token it sees, SentencePiece's, keeps the output's); the output
    decoded alone where the joint text keeps less of the context's
    (``_text_added``)."""
    if context_ids:
        head = tokenizer.raw_decode(context_ids, skip_special_tokens)
        joint = tokenizer.raw_decode([*context_ids, *output_ids], skip_special_tokens)
        text = _text_added(head, joint)
        if text is not None:
            return text
    return tokenizer.raw_decode(output_ids, skip_special_tokens)


def _ends_held(tokenizer: Tokenizer, token_ids: list[int], end: int,
               skip_special_tokens: bool) -> bool:
    """Whether the text of ``token_ids[:end]`` (``end`` at least
    ``_TAIL_WINDOW_TOKENS``) surely ends in U+FFFD, read from its last few
    tokens alone: four windows ending at ``end``, of 4 to 7 tokens, each
    ends in U+FFFD. False means only that it may not (a decode of the
    whole text decides). So a long run of text held back (U+FFFDs, stray
    bytes) costs a few tokens' decode per token, not the run's.

    Sound for the decoders tokenizers ship: a byte-level decoder (bytes
    joined, then read as UTF-8 with U+FFFD for each bad part) ends its
    text with the last character or bad part of the bytes, at most four
    bytes, so within the last four tokens, and a decode that begins inside
    an earlier character reads only that character's remaining bytes
    otherwise (one U+FFFD each), so the last one is read alike. A
    byte-fallback decoder (``<0xNN>`` tokens, one byte each) reads a run of
    byte tokens as UTF-8 if the whole run is, else as one U+FFFD a byte:
    where the text ends in a character that is not U+FFFD, the run is
    UTF-8 and one of four windows begins where a character of it begins,
    so that window's run is UTF-8 too and ends in that character. Other
    decoders write each token's text by itself. The converse fails only
    for byte-fallback: a run of byte tokens with a bad byte far back, then
    whole characters, reads as U+FFFDs throughout while its last tokens
    read as characters; there each character's end costs a decode of the
    held run (the text stays exact)."""
    for size in range(_TAIL_TOKENS, _TAIL_WINDOW_TOKENS + 1):
        text = tokenizer.raw_decode(token_ids[end - size : end], skip_special_tokens)
        if not text.endswith("\ufffd"):
            return False
    return True


def _bare_added_texts(tokenizer: Tokenizer, skip_special_tokens: bool,
                      spaces_between_special_tokens: bool) -> dict[int, str] | None:
    """The added tokens' texts where an added token after another shows as
    its bare text (vLLM: only while special tokens are shown and not spaced
    apart, and only where the tokenizer has added tokens); None otherwise."""
    if skip_special_tokens or spaces_between_special_tokens or not tokenizer.added_texts:
        return None
    return tokenizer.added_texts


def _text_with_bare_added(tokenizer: Tokenizer, context_ids: list[int], output_ids: list[int],
                          added_texts: dict[int, str]) -> str:
    """The text ``output_ids`` add after ``context_ids`` (special tokens
    shown), where each added token that follows an added token of the
    output adds its bare text, as vLLM's fast detokenizer writes it without
    ``spaces_between_special_tokens``; the runs between those tokens add
    what they add after everything before them."""
    ids = [*context_ids, *output_ids]

    def run_text(start: int, end: int) -> str:  # output_ids[start:end] after what precedes
        if start == end:
            return ""
        if start == 0:
            return _text_after(tokenizer, context_ids, output_ids[:end], False)
        at = len(context_ids) + start
        return _text_after(tokenizer, ids[max(0, at - _CONTEXT_TOKENS) : at],
                           output_ids[start:end], False)

    text, start = "", 0
    for i in range(1, len(output_ids)):
        if output_ids[i] in added_texts and output_ids[i - 1] in added_texts:
            text += run_text(start, i) + added_texts[output_ids[i]]
            start = i + 1
    return text + run_text(start, len(output_ids))


def _whole_text(tokenizer: Tokenizer, context_ids: list[int], output_ids: list[int],
                skip_special_tokens: bool, spaces_between_special_tokens: bool) -> str:
    added_texts = _bare_added_texts(tokenizer, skip_special_tokens,
                                    spaces_between_special_tokens)
    if added_texts is None:
        return _text_after(tokenizer, context_ids, output_ids, skip_special_tokens)
    return _text_with_bare_added(tokenizer, context_ids, output_ids, added_texts)


def _released_text(tokenizer: Tokenizer, context_ids: list[int], output_ids: list[int],
                   skip_special_tokens: bool, spaces_between_special_tokens: bool) -> str:
    """The text of the longest start of ``output_ids`` whose text does not
    end in U+FFFD: all that a token-by-token detokenizer has released when
    the output ends (the tokens after it stay held back). Usually the whole
    output: one decode. Otherwise the starts are tried from the longest,
    each first by its last tokens (``_ends_held``), so a long held run costs
    its length and one more decode of the output. Skipped special tokens
    decode to nothing: they are left out first, as a run of them would
    read as text that may not end in U+FFFD."""
    if skip_special_tokens:
        output_ids = [t for t in output_ids if t not in tokenizer.special_ids]
    for end in range(len(output_ids), 0, -1):
        if (end < len(output_ids) and end >= _TAIL_WINDOW_TOKENS
                and _ends_held(tokenizer, output_ids, end, skip_special_tokens)):
            continue
        text = _whole_text(tokenizer, context_ids, output_ids[:end], skip_special_tokens,
                           spaces_between_special_tokens)
        if not text.endswith("\ufffd"):
            return text
    return ""


def output_text(tokenizer: Tokenizer, prompt_token_ids: list[int], output_ids: list[int],
                skip_special_tokens: bool = True,
                spaces_between_special_tokens: bool = True) -> str:
    """An output's whole text as it reads after its prompt, as vLLM's
    detokenizer of a fast tokenizer gives it: what ``IncrementalDetokenizer``'s
    pieces add up to, in one decode. For a byte-level tokenizer,
    ``tokenizer.raw_decode(output_ids)`` less an incomplete character (or
    a U+FFFD) at its end; for a SentencePiece one, an output whose first
    token begins a word begins with its space."""
    return _released_text(tokenizer,
                          _context_ids(tokenizer, prompt_token_ids, skip_special_tokens),
                          output_ids, skip_special_tokens, spaces_between_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, as vLLM's detokenizer
    of a fast tokenizer (tokenizers' ``DecodeStream``) does: a token's text
    is released once the text decoded so far does not end in U+FFFD (an
    incomplete UTF-8 sequence), so a piece never ends inside a character;
    what is held back when the output ends is never released.

    Keeps a window ``[prefix_offset, read_offset)`` of already released
    tokens before the unreleased ones and decodes only the window, so each
    step costs O(window), not O(output). While more than a few tokens are
    held back (a run of U+FFFDs or stray bytes that a degenerate output
    can repeat for thousands of tokens), their last few tokens tell that
    the text still ends in U+FFFD (``_ends_held``), and the held tokens
    are decoded whole only for the step that releases them: such a run
    costs its length, once, not its square. The window starts with the
    prompt's last tokens (``_context_ids``), so the first token's text is
    what it adds after the prompt (``_text_added``: after a prompt that
    ends inside a character, that character completed). Several tokens fed at once give what
    they give fed one at a time, joined. Without
    ``spaces_between_special_tokens`` (special tokens shown) tokens are
    taken one at a time, and an added token after an added token gives its
    bare text (vLLM's rule; the one before it has released everything, so
    its piece is its text alone). The concatenated pieces equal
    ``output_text(tokenizer, prompt, output ids, skip_special_tokens,
    spaces_between_special_tokens)``, which is what ``output_text`` gives:
    the released text is kept as a ``GrowingText`` (pieces joined in chunks),
    joined where ``output_text`` is asked for. So a long output costs its
    length, not the square of it, in work and in memory (the server keeps
    a detokenizer for every running request).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int] = (),
                 skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._ids = _context_ids(tokenizer, prompt_token_ids, skip_special_tokens)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._bare_added = _bare_added_texts(tokenizer, skip_special_tokens,
                                             spaces_between_special_tokens)
        self._after_added = False  # the last token fed was an added token
        self._released = GrowingText()

    @property
    def output_text(self) -> str:
        """The text released so far."""
        return str(self._released)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.raw_decode(token_ids, self.skip_special_tokens)

    def feed(self, token_ids: list[int]) -> str:
        """Add new tokens; return the text they release (may be "")."""
        if self._bare_added is None:
            piece = self._step(token_ids)
        else:
            piece = "".join([self._step_one(token) for token in token_ids])
        if piece:
            self._released.add(piece)
        return piece

    def _step_one(self, token: int) -> str:
        piece = self._step([token])
        bare = self._bare_added.get(token)
        if bare is not None and self._after_added:
            piece = bare
        self._after_added = bare is not None
        return piece

    def _step(self, token_ids: list[int]) -> str:
        """The text ``token_ids`` release after the window: up to the last
        of them after which the text does not end in U+FFFD (usually the
        last: one decode); moves the window past that one. Under
        ``skip_special_tokens`` special tokens never enter the window: they
        decode to nothing, so the text is the same without them, while a
        window that kept them would not move past them (they release no
        text) and would grow by each one (a run of EOS under ``ignore_eos``
        would cost the square of its length)."""
        if self.skip_special_tokens:
            token_ids = [t for t in token_ids if t not in self.tokenizer.special_ids]
            if not token_ids:
                return ""
        start = len(self._ids)
        self._ids.extend(token_ids)
        decode = self._decode
        for end in range(len(self._ids), start, -1):
            if (end - self._read_offset >= _TAIL_WINDOW_TOKENS
                    and _ends_held(self.tokenizer, self._ids, end, self.skip_special_tokens)):
                continue
            new_text = decode(self._ids[self._prefix_offset : end])
            if not new_text.endswith("\ufffd"):
                break
        else:
            return ""
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        piece = _text_added(prefix_text, new_text)
        if piece is None:  # a decoder that rewrote the window's text
            piece = new_text[len(prefix_text) :]
        if not piece:
            return ""
        # The window's next start is where this step's text began, unless
        # that is inside a character (the prompt's context cut it: its text
        # ends in U+FFFD), where a byte-fallback decoder would read the
        # bytes from there on as U+FFFDs: the window then keeps its start
        # one step more (its text up to ``end`` ends in a whole character).
        if not prefix_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
        self._read_offset = end
        return piece


def pair_lengths(len_1: int, len_2: int, max_length: int, num_special: int) -> tuple[int, int]:
    """How many of each text's ids a pair keeps within ``max_length`` ids,
    ``num_special`` of them the template's special tokens: tokenizers'
    "longest_first" rule (transformers' default for a pair), which cuts the
    longer text down to the shorter one's length (or to what is left beside
    it), then both to half of the room each. ``InvalidRequestError`` where
    the special tokens alone exceed ``max_length``."""
    room = max_length - num_special
    if room < 0:
        raise InvalidRequestError(f"truncate_prompt_tokens {max_length} leaves no room for the "
                                  f"{num_special} special tokens of a text pair",
                                  param="truncate_prompt_tokens")
    if len_1 + len_2 <= room:
        return len_1, len_2
    short, long = sorted((len_1, len_2))
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short, long = room // 2, room // 2 + room % 2
    return (short, long) if len_1 <= len_2 else (long, short)

