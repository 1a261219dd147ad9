"""``LLM``: the in-process API, with vLLM's names."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestOutput, RequestOutputDelta, shown_token_ids
from engine.progress import RequestProgress
from engine.sampling_params import SamplingParams


class LLM:
    """``LLM(model="tiny", tensor_parallel_size=2, device="cpu", ...)``.

    Keyword arguments are those of ``EngineConfig``. Use as a context
    manager, or call ``shutdown()``: it stops every worker process (as
    does the garbage collector, once nothing refers to the ``LLM``).
    """

    def __init__(self, model: str = "tiny", **kwargs):
        self._start(EngineConfig(model=model, **kwargs))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        # A worker in this process (TP=1) sizes torch's thread pool for
        # itself; the caller's setting comes back at shutdown.
        self._caller_num_threads = torch.get_num_threads()
        try:
            self.engine = LLMEngine(config)
        except BaseException:
            torch.set_num_threads(self._caller_num_threads)
            raise
        # Holds the engine, not the LLM, so the LLM itself can be collected;
        # dead once the engine is shut down.
        self._finalizer = weakref.finalize(self, _stop, self.engine, self._caller_num_threads)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | dict | Sequence[str | dict],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of ``prompts``.

        If the call is interrupted (Ctrl-C, an exception from a callback),
        its unfinished requests are aborted before the exception goes on, so
        the next call starts from an idle engine.
        """
        if not self._finalizer.alive:
            raise RuntimeError("this LLM has been shut down")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if not all(isinstance(p, SamplingParams) for p in sampling_params):
            raise ValueError("sampling_params is a SamplingParams or a list of them, "
                             f"got {type(sampling_params).__name__}")
        if len(sampling_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        engine = self.engine
        # Make (and so check) all before queueing any: a bad prompt queues nothing.
        requests = [engine.new_request(p, params) for p, params in zip(prompts, sampling_params)]
        outputs: dict[str, RequestOutput] = {}
        order = []
        for prompt, request in zip(prompts, requests):
            engine.enqueue(request)
            text = prompt if isinstance(prompt, str) else prompt.get("prompt")
            outputs[request.req_id] = RequestOutput(
                request.req_id, text, request.prompt_token_ids, [CompletionOutput(0, "", [])]
            )
            order.append(request.req_id)
        try:
            self._run_to_completion(outputs, use_tqdm)
        except BaseException:
            unfinished = [r for r in order if not outputs[r].finished]
            with contextlib.suppress(Exception):  # an engine that died stays dead
                engine.abort(unfinished)
            raise
        return [outputs[r] for r in order]

    def _run_to_completion(self, outputs: dict[str, RequestOutput], use_tqdm: bool) -> None:
        """Step until the engine is idle, adding each delta to its output."""
        engine = self.engine
        with RequestProgress(len(outputs), "generate", use_tqdm) as progress:
            while engine.has_unfinished_requests():
                # Deltas of an earlier, interrupted call's requests are not ours.
                deltas = [d for d in engine.step() if d.req_id in outputs]
                for delta in deltas:
                    _absorb_prompt_side(outputs[delta.req_id], delta)
                    completion = outputs[delta.req_id].outputs[0]
                    completion.token_ids.extend(delta.new_token_ids)
                    if delta.logprobs is not None:
                        completion.logprobs = (completion.logprobs or []) + delta.logprobs
                    if delta.finished:
                        completion.finish_reason = delta.finish_reason
                        completion.stop_reason = delta.stop_reason
                        outputs[delta.req_id].finished = True
                        completion.text = engine.tokenizer.decode(
                            shown_token_ids(delta, completion.token_ids, through_end=True))
                progress.advance(sum(d.finished for d in deltas),
                                 sum(len(d.new_token_ids) for d in deltas))

    def shutdown(self) -> None:
        """Stop the workers and give the caller back its torch thread count
        (what the garbage collector does too; a second call does nothing)."""
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _stop(engine: LLMEngine, caller_num_threads: int) -> None:
    """``LLM.shutdown``'s work, also run when an ``LLM`` is collected."""
    try:
        engine.shutdown()
    finally:
        torch.set_num_threads(caller_num_threads)


def _absorb_prompt_side(output: RequestOutput, delta: RequestOutputDelta) -> None:
    """What a delta says of the prompt: its logprobs (once) and the prefix-cache hits."""
    if delta.prompt_logprobs is not None:
        output.prompt_logprobs = delta.prompt_logprobs
    if delta.num_cached_tokens is not None:
        output.num_cached_tokens = delta.num_cached_tokens
