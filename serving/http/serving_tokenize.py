"""POST /tokenize, POST /detokenize and GET /tokenizer_info, in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (``add_special_tokens`` true: tokenized as
the engine tokenizes a text prompt; false: the text's own tokens) or chat
``messages`` (rendered with the model's chat template, or the request's
own ``chat_template`` under the chat route's rule, ``request_template.py``,
and any ``tools``, as the chat route does) and answers ``{"count", "max_model_len", "tokens", "token_strs"}``.
``/detokenize`` answers ``{"prompt"}`` for ``tokens``, decoded as vLLM's
route decodes them (transformers' ``decode`` with its defaults): special
tokens shown, and an id the tokenizer does not know (one of the padded
rows a model's vocabulary may have past the tokenizer's) left out; an id
the tokenizer cannot read at all, below 0 or from 2**32 on (its ids are
unsigned 32-bit), is a 400 naming ``tokens``, as vLLM refuses it.
Neither route holds its tokens to ``max_model_len`` (vLLM's tokenize
parameters for them set no total): they serve no generation, so a text or
ids longer than the context are tokenized or decoded whole.
``/tokenizer_info`` gives the special tokens and
the chat template, which evaluation harnesses read to tokenize through
the server.
"""

from __future__ import annotations

from engine.tool_depth import check_tool_depth
from ipc.errors import InvalidRequestError
from serving.http.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    FieldError,
    TokenizeRequest,
)
from serving.http.state import ServerState
from serving.http.tools import rendered_tools

# The tokenizer reads token ids as unsigned 32-bit integers.
_TOKEN_ID_END = 1 << 32


def tokenize(state: ServerState, request: TokenizeRequest) -> dict:
    state.check_model(request.model)
    if (request.prompt is None) == (request.messages is None):
        raise InvalidRequestError("give exactly one of prompt and messages")
    tok = state.tokenizer
    if request.messages is not None:
        from serving.http.serving_chat import chat_prompt

        chat = ChatCompletionRequest(messages=request.messages,
                                     add_generation_prompt=request.add_generation_prompt,
                                     chat_template_kwargs=request.chat_template_kwargs,
                                     chat_template=request.chat_template,
                                     tools=request.tools)
        check_tool_depth(rendered_tools(chat))  # before the template walks them
        ids = chat_prompt(state, chat)
    elif request.add_special_tokens:
        ids = tok.encode(request.prompt)
    else:
        ids = tok.hf.encode(request.prompt, add_special_tokens=False).ids
    strs = [tok.token_text(t) for t in ids] if request.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids,
            "token_strs": strs}


def detokenize(state: ServerState, request: DetokenizeRequest) -> dict:
    state.check_model(request.model)
    bad = [t for t in request.tokens if not 0 <= t < _TOKEN_ID_END]
    if bad:
        raise FieldError("tokens", f"{bad[:5]} are no token ids: a token id is an integer "
                                   f"in [0, {_TOKEN_ID_END})")
    return {"prompt": state.tokenizer.decode(request.tokens, skip_special_tokens=False)}


def tokenizer_info(state: ServerState) -> dict:
    """The tokenizer's special tokens and the template the chat routes
    render with: the server's ``--chat-template`` where it has one, as
    vLLM's reports it, else the model's."""
    tok = state.tokenizer
    return {"tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": tok.token_text(tok.bos_token_id),
            "eos_token": tok.token_text(tok.eos_token_id),
            "pad_token": None,
            "chat_template": state.chat_template or tok.chat_template,
            "model_max_length": state.max_model_len}
