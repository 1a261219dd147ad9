"""POST /classify (vLLM's classification API, on a sequence classifier).

The body is one of vLLM's two: ``input`` (a text, a list of texts, a list
of token ids or a list of lists of token ids, as /v1/embeddings takes it),
each item one prompt; or chat ``messages``, one prompt, rendered as
/pooling renders them (``pooling_prompts.body_prompts``: no generation
prompt and no special tokens beyond the template's unless asked). Each
prompt becomes one classification request to the engine
(``PoolingParams`` task "classify", through ``embed_prompts``, the pooling
routes' one way to the engine). The answer is vLLM's: ``{"id":
"classify-...", "object": "list", "created", "model", "data", "usage"}``,
``data`` one ``{"index", "label", "probs", "num_classes"}`` a prompt in
input order, ``label`` the name (config.json's ``id2label``) of the most
probable class, ``probs`` the logits through the classifier's activation
(``engine.classify_head``; the logits with ``use_activation`` false).
``usage`` counts the prompt tokens. A body with both ``input`` and
``messages`` or neither, an empty input, messages the template refuses, or
a prompt the engine refuses (too long, ids outside the vocabulary), is a
400 and nothing of the request keeps running.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
from pydantic import ConfigDict
from starlette.responses import JSONResponse, Response

from serving.http.pooling_prompts import PoolingPromptFields, body_prompts
from serving.http.serving_embedding import Int64, TruncatePromptTokens, embed_prompts
from serving.http.state import ServerState


class ClassificationRequest(PoolingPromptFields):
    """vLLM's completion-style body (``input``) or chat-style one
    (``messages``), both with ``model``, ``truncate_prompt_tokens``,
    ``priority``, ``use_activation`` and ``user``; other fields are
    ignored, as vLLM ignores them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    use_activation: bool | None = None
    priority: Int64 = 0


async def create_classification(state: ServerState, request: ClassificationRequest) -> Response:
    state.check_model(request.model)
    prompts = await body_prompts(state, request)
    pooling = {"task": "classify", **{name: value for name, value in (
        ("use_activation", request.use_activation),
        ("truncate_prompt_tokens", request.truncate_prompt_tokens)) if value is not None}}
    outputs, lengths = await embed_prompts(state, prompts, pooling, request.priority,
                                           state.lora_request(request.model))
    data = []
    for i, output in enumerate(outputs):
        probs = np.frombuffer(output, dtype="<f4").tolist()
        best = int(np.argmax(probs))
        data.append({"index": i, "label": _label(state.labels, best), "probs": probs,
                     "num_classes": len(probs)})
    num_tokens = sum(lengths)
    return JSONResponse({
        "id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
        "model": state.shown_model(request.model), "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                  "completion_tokens": 0}})


def _label(labels: tuple[str, ...], index: int) -> str | None:
    """The name of class ``index`` (None where the model names none, as vLLM answers)."""
    return labels[index] if index < len(labels) else None
