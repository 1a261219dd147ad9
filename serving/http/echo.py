"""``echo``: on /v1/completions the prompt before the completion's text
and, with ``logprobs``, its tokens before the completion's; on
/v1/chat/completions (vLLM's field) the last message's text before the
answer's.

The prompt's text is the request's own string, or the decoded ids of a
token prompt. Its logprobs are the engine's prompt logprobs (the request
asks for them whenever ``echo`` and ``logprobs`` are both set): the first
token has null ``token_logprobs`` and ``top_logprobs``; ``text_offset``
runs from 0 over the prompt's tokens (a BOS token's text included, as
vLLM counts it), then on over the completion's.

A chat answer has the role ``answer_role`` gives (vLLM's rule: the
server's response role, "assistant" unless ``--response-role`` says
otherwise, after a generation prompt, else the last message's, as with
``continue_final_message``). Its echo is the last message's text (text
parts joined by newlines, as the template reads them) when that message
has the answer's role, else nothing. The echo is text only: the answer's
logprobs and usage count the generated tokens alone, as vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint.chat_template import message_text
from ipc.engine_messages import TokenLogprob
from serving.http.logprobs import LogprobsFormatter, TextOffsets


@dataclass(frozen=True)
class EchoedPrompt:
    text: str
    token_ids: list[int]

    def logprobs(self, formatter: LogprobsFormatter,
                 prompt_logprobs: list[list[TokenLogprob] | None] | None,
                 num_top: int, offsets: TextOffsets, as_ids: bool = False) -> dict:
        """The prompt's part of a choice's ``logprobs``, its offsets the
        first of the choice's ``offsets`` (``as_ids``: tokens named by id)."""
        entries = prompt_logprobs or [None] * len(self.token_ids)
        return formatter.completion(self.token_ids, entries, num_top, offsets, as_ids)


def echoed_prompts(tokenizer, prompt, prompt_ids: list[list[int]]) -> list[EchoedPrompt]:
    """One ``EchoedPrompt`` per prompt of the request (texts as given)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    texts = [p if isinstance(p, str) else None for p in prompt]
    if len(texts) != len(prompt_ids):  # one list of ids
        texts = [None]
    return [EchoedPrompt(text if text is not None else tokenizer.decode(ids), ids)
            for text, ids in zip(texts, prompt_ids)]


def answer_role(request, response_role: str = "assistant") -> str:
    """The role of a chat answer (``request`` a ``ChatCompletionRequest``;
    ``response_role`` vLLM's ``--response-role``)."""
    if request.add_generation_prompt or not request.messages:
        return response_role
    return request.messages[-1].role


def chat_echo(request, role: str) -> str | None:
    """What a chat answer of ``role`` starts with: None without ``echo``;
    the last message's text where it has that role; "" otherwise."""
    if not request.echo:
        return None
    last = request.messages[-1] if request.messages else None
    if last is None or last.role != role:
        return ""
    return message_text(last.content)
