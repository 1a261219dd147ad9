"""The grammar backend: llguidance over the model's own tokenizer.

``GuidanceBackend`` describes the vocabulary to llguidance once per model
(``LLTokenizer`` built from the model directory's ``tokenizer.json``, the
same file the engine's tokenizer reads, GGUF-derived ones included, sized to
the model's vocabulary so that ids past the tokenizer's are never allowed;
its EOS ids are the model's). llguidance reads byte-level and
SentencePiece-legacy decoders itself; for a ``Metaspace`` decoder, which it
cannot read, tprun gives it every token's bytes (``metaspace_tokens``).
``compile`` turns a ``GrammarKey`` into a template matcher; each request
then gets its own copy (``new_matcher``).

The tokenizer is built on first use, inside a compile (off the engine
loop), once: building it reads every token's bytes (about a second for a
128k vocabulary). llguidance is imported only then, so an engine that never
sees a constrained request never loads it.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from engine.structured_outputs import metaspace_tokens, structural_tags
from engine.structured_outputs.dangling_escape import dangling_escape
from engine.structured_outputs.params import GrammarKey
from ipc.errors import InvalidRequestError


class GrammarError(InvalidRequestError):
    """A schema, regex or grammar that cannot be compiled (or not within the
    compile time limit); the message says why."""


_KIND_NAMES = {"json": "JSON schema", "regex": "regex", "choice": "choice",
               "grammar": "grammar", "structural_tag": "structural tag"}
# A GBNF rule definition (``name ::= ...``) at the start of a line: no Lark
# grammar has one, every GBNF grammar does. Any other grammar is Lark, its
# start rule spelled ``start:``, ``?start:`` or ``!start:`` alike (llguidance's
# own guess takes only ``start:`` for Lark, and reads the others as GBNF).
_GBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z0-9_-]+[ \t]*::=")


class GuidanceBackend:
    def __init__(self, tokenizer_json_path: str, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer_json_path = tokenizer_json_path
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        """The llguidance tokenizer (built once, thread-safe)."""
        with self._lock:
            if self._tokenizer is None:
                from llguidance import LLTokenizer

                with open(self.tokenizer_json_path, encoding="utf-8") as f:
                    text = f.read()
                spec = json.loads(text)
                if metaspace_tokens.decodes_metaspace(spec):
                    self._tokenizer = metaspace_tokens.lltokenizer(spec, self.vocab_size,
                                                                   self.eos_token_ids)
                else:
                    eos = self.eos_token_ids or None
                    self._tokenizer = LLTokenizer(text, n_vocab=self.vocab_size, eos_token=eos)
            return self._tokenizer

    def compile(self, key: GrammarKey) -> Any:
        """A template ``LLMatcher`` for ``key``; ``GrammarError`` if it does
        not compile (the backend's message, which names the problem)."""
        from llguidance import LLMatcher

        grammar = _grammar_text(key, self)
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {_KIND_NAMES[key.kind]}: "
                               f"{_one_line(matcher.get_error())}")
        return matcher

    @staticmethod
    def new_matcher(template: Any) -> Any:
        """A request's own matcher, at the start of the grammar."""
        return template.deep_copy()


def _grammar_text(key: GrammarKey, backend: GuidanceBackend) -> str:
    """llguidance's grammar for ``key``; the tokenizer is built only for
    the kind that reads it (a structural tag's special triggers), so a bad
    constraint of another kind fails before it is."""
    from llguidance import LLMatcher, grammar_from

    problem = dangling_escape(key)  # llguidance would drop the backslash, not fail
    if problem is not None:
        raise GrammarError(f"invalid {_KIND_NAMES[key.kind]}: {problem}")
    try:
        if key.kind == "json":
            options = {"whitespace_flexible": not key.compact_json}
            return LLMatcher.grammar_from_json_schema(key.text, defaults=options)
        if key.kind == "regex":
            return LLMatcher.grammar_from_regex(key.text)
        if key.kind == "choice":
            lark = "start: " + " | ".join(json.dumps(c) for c in json.loads(key.text))
            return LLMatcher.grammar_from_lark(lark)
        if key.kind == "structural_tag":
            return structural_tags.lark(key.text, backend.tokenizer, key.compact_json)
        return grammar_from("gbnf" if _GBNF_RULE.search(key.text) else "lark", key.text)
    except ValueError as e:
        raise GrammarError(f"invalid {_KIND_NAMES[key.kind]}: {_one_line(str(e))}") from None


def _one_line(message: str, limit: int = 400) -> str:
    """The backend's message on one line: its caret pictures and the grammar
    lines it quotes left out, the rest joined (and cut to ``limit``)."""
    kept = []
    for line in message.strip().splitlines():
        text = line.strip()
        if not text or set(text) <= {"^", " ", "~"} or re.match(r"^\d+ \|", text):
            continue
        kept.append(text)
    joined = " ".join(kept)
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."
