"""vLLM's pooling tasks, and which of them a pooling engine serves
(``LLM.encode``'s ``pooling_task``, HTTP ``/pooling``'s ``task``).

vLLM names six: "embed" and "classify" (one vector a prompt), "score",
"token_embed" and "token_classify" (one row a prompt token) and "plugin".
tprun's pooling engine serves its own task (``PoolerSettings.task``,
"embed" or "classify") and that task's token-level twin, as vLLM's pooler
for such a model does: an embedding model "embed" and "token_embed" (each
prompt token's final-normed hidden state), a classifier "classify" and
"token_classify" (each prompt token's logits). A task the engine does not
serve is refused with vLLM's message: the embedding or classification API
named where the task is of that kind, else the unsupported task and the
supported ones.
"""

from __future__ import annotations

from ipc import serde
from ipc.config import TOKEN_POOLING_TASKS
from ipc.errors import InvalidRequestError

# Each served task's token-level twin (vLLM's pooler serves both).
TOKEN_TWINS = {"embed": "token_embed", "classify": "token_classify"}

# vLLM's words for an ``LLM.encode`` call that names no task.
TASK_REQUIRED = (
    "pooling_task required for `LLM.encode`\n"
    "Please use one of the more specific methods or set the pooling_task when using "
    "`LLM.encode`:\n"
    '  - For embeddings, use `LLM.embed(...)` or `pooling_task="embed"`.\n'
    '  - For classification logits, use `LLM.classify(...)` or `pooling_task="classify"`.\n'
    "  - For similarity scores, use `LLM.score(...)`.")


def supported_tasks(served: str) -> tuple[str, ...]:
    """The tasks an engine serving ``served`` (its own task) answers."""
    return served, TOKEN_TWINS[served]


def is_token_task(task: str | None) -> bool:
    """Whether ``task`` answers one row a prompt token."""
    return task in TOKEN_POOLING_TASKS


def check_pooling_task(task: str | None, served: str | None, param: str = "pooling_task") -> str:
    """``task`` where the engine serving ``served`` (its pooling task; None:
    a generating engine) serves it (``supported_tasks``), else
    ``InvalidRequestError`` with vLLM's message, naming ``param`` (the
    caller's name of the field)."""
    if served is None:
        raise InvalidRequestError("LLM.encode() is only supported for pooling models. Try "
                                  "passing `--runner pooling` to use the model as a pooling "
                                  "model.")
    if task is None:
        raise InvalidRequestError(TASK_REQUIRED, param=param)
    supported = supported_tasks(served)
    if task in supported:
        return task
    if task in ("embed", "token_embed"):
        raise InvalidRequestError("Embedding API is not supported by this model. Try converting "
                                  "the model using `--convert embed`.", param=param)
    if task in ("classify", "token_classify"):
        raise InvalidRequestError("Classification API is not supported by this model. Try "
                                  "converting the model using `--convert classify`.",
                                  param=param)
    raise InvalidRequestError(f"Unsupported task: {task!r} Supported tasks: {supported}",
                              param=param)


def check_pooled_rows(task: str, num_rows: int, row_size: int) -> None:
    """``InvalidRequestError`` unless ``num_rows`` rows of ``row_size``
    float32 values (a token-level request's answer, one row a prompt token)
    fit the pooled bytes one engine message carries
    (``ipc.serde.MAX_POOLED_BYTES``): they travel whole in its last delta,
    and a larger message would be cut with every message after it."""
    size = num_rows * row_size * 4
    if size > serde.MAX_POOLED_BYTES:
        raise InvalidRequestError(
            f"{task} answers a row of {row_size} float32 values a prompt token: {num_rows} "
            f"tokens make {size} bytes, more than the {serde.MAX_POOLED_BYTES} bytes one "
            "engine message carries; send a shorter prompt (truncate_prompt_tokens)",
            param="input")
