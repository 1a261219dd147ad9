"""Engine links for running the HTTP app in process (``create_app``) with
an engine whose answers a test decides: the link interface the app uses
(``start``, ``close``, ``new_id``, ``submit``, ``abort``, ``forget``), and
every message it sends is one the engine sends (``ipc.engine_messages``).
Under a reasoning parser (``reasoning``, ``engine.reasoning.Reasoning``)
each acceptance says where the output begins by the engine's own rule."""

from __future__ import annotations

import itertools

from engine.reasoning import Reasoning
from ipc.engine_messages import Delta, EngineStopped, RequestAccepted, TokenLogprob


class AcceptingLink:
    """Accepts every request and sends no output, so each runs until it is
    aborted (or, with ``stops``, the engine stops right after accepting
    it); it notes the requests still live when it is closed."""

    def __init__(self, stops: bool = False, reasoning: Reasoning | None = None) -> None:
        self.ids = itertools.count()
        self.live: set[str] = set()
        self.live_at_close: set[str] | None = None
        self.stops = stops
        self.reasoning = reasoning
        self.enable_thinking: list[bool] = []  # each request's, as submitted

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.live_at_close = set(self.live)

    def new_id(self) -> str:
        return f"req-{next(self.ids)}"

    def submit(self, request_id, prompt_token_ids, params, queue, priority=0,
               enable_thinking=True, cache_salt=None, lora_request=None) -> None:
        self.live.add(request_id)
        self.enable_thinking.append(enable_thinking)
        inside = self.reasoning is not None and self.reasoning.starts_inside(prompt_token_ids,
                                                                             enable_thinking)
        queue.put_nowait(RequestAccepted(request_id=request_id,
                                         prompt_token_ids=list(prompt_token_ids),
                                         starts_in_reasoning=inside))
        if self.stops:
            queue.put_nowait(EngineStopped(reason="a worker died\ntraceback"))

    def abort(self, request_id: str) -> None:
        self.live.discard(request_id)

    forget = abort


class AnsweringLink(AcceptingLink):
    """Accepts every request and answers it at once, whatever it asked:
    ``token_ids`` whose text is ``text``, finished with ``finish_reason``."""

    def __init__(self, token_ids: list[int], text: str, finish_reason: str) -> None:
        super().__init__()
        self.token_ids, self.text, self.finish_reason = token_ids, text, finish_reason

    def submit(self, request_id, prompt_token_ids, params, queue, priority=0,
               enable_thinking=True, cache_salt=None, lora_request=None) -> None:
        super().submit(request_id, prompt_token_ids, params, queue, priority, enable_thinking)
        queue.put_nowait(Delta(request_id=request_id, token_ids=list(self.token_ids),
                               text=self.text, finished=True,
                               finish_reason=self.finish_reason))


class RecordingLink(AnsweringLink):
    """An ``AnsweringLink`` that keeps each prompt the engine is given
    (``prompts``) and answers "hi" (ids 104, 105)."""

    def __init__(self) -> None:
        super().__init__([104, 105], "hi", "stop")
        self.prompts: list[list[int]] = []

    def submit(self, request_id, prompt_token_ids, *args, **kwargs) -> None:
        self.prompts.append(list(prompt_token_ids))
        super().submit(request_id, prompt_token_ids, *args, **kwargs)


class TextLink(AcceptingLink):
    """Accepts every request and answers it at once with ``pieces`` of
    text, one delta each, the last finished with ``finish_reason``; each
    piece's token ids are the ``tokenizer``'s for it (one added token, such
    as a tag, is one id). A request that asks for logprobs gets the output's
    token n (from 0) alone at rank 1 with logprob ``-(n + 1) / 16``
    (``made_up_logprob``), so a logprob tells which token it is."""

    def __init__(self, tokenizer, pieces: list[str], finish_reason: str = "stop",
                 reasoning: Reasoning | None = None) -> None:
        super().__init__(reasoning=reasoning)
        self.tokenizer, self.pieces, self.finish_reason = tokenizer, pieces, finish_reason

    def submit(self, request_id, prompt_token_ids, params, queue, priority=0,
               enable_thinking=True, cache_salt=None, lora_request=None) -> None:
        super().submit(request_id, prompt_token_ids, params, queue, priority, enable_thinking)
        asked = params.get("logprobs") is not None
        n = 0
        for i, piece in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            ids = self.tokenizer.encode(piece, add_special_tokens=False)
            logprobs = ([[TokenLogprob(t, made_up_logprob(n + j), 1)] for j, t in enumerate(ids)]
                        if asked else None)
            n += len(ids)
            queue.put_nowait(Delta(request_id=request_id, token_ids=ids, text=piece,
                                   finished=last, logprobs=logprobs,
                                   finish_reason=self.finish_reason if last else None))


def made_up_logprob(n: int) -> float:
    """``TextLink``'s logprob of an output's token n (from 0)."""
    return -(n + 1) / 16
