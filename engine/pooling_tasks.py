"""vLLM's pooling tasks, and which of them a pooling engine serves
(``LLM.encode``'s ``pooling_task``, HTTP ``/pooling``'s ``task``).

vLLM names six: "embed" and "classify" (one vector a prompt), "score",
"token_embed" and "token_classify" (one row a prompt token) and "plugin".
tprun's pooling engine serves one of them, its own task (``PoolerSettings
.task``, "embed" or "classify"): the runner pools one row a request, so no
token-level task is served. A task the engine does not serve is refused
with vLLM's message: the embedding or classification API named where the
task is of that kind, else the unsupported task and the supported ones.
"""

from __future__ import annotations

from ipc.errors import InvalidRequestError

# vLLM's words for an ``LLM.encode`` call that names no task.
TASK_REQUIRED = (
    "pooling_task required for `LLM.encode`\n"
    "Please use one of the more specific methods or set the pooling_task when using "
    "`LLM.encode`:\n"
    '  - For embeddings, use `LLM.embed(...)` or `pooling_task="embed"`.\n'
    '  - For classification logits, use `LLM.classify(...)` or `pooling_task="classify"`.\n'
    "  - For similarity scores, use `LLM.score(...)`.")


def check_pooling_task(task: str | None, served: str | None, param: str = "pooling_task") -> str:
    """``task`` where the engine serving ``served`` (its pooling task; None:
    a generating engine) serves it, else ``InvalidRequestError`` with
    vLLM's message, naming ``param`` (the caller's name of the field)."""
    if served is None:
        raise InvalidRequestError("LLM.encode() is only supported for pooling models. Try "
                                  "passing `--runner pooling` to use the model as a pooling "
                                  "model.")
    if task is None:
        raise InvalidRequestError(TASK_REQUIRED, param=param)
    if task == served:
        return task
    if task == "embed":
        raise InvalidRequestError("Embedding API is not supported by this model. Try converting "
                                  "the model using `--convert embed`.", param=param)
    if task == "classify":
        raise InvalidRequestError("Classification API is not supported by this model. Try "
                                  "converting the model using `--convert classify`.",
                                  param=param)
    raise InvalidRequestError(f"Unsupported task: {task!r} Supported tasks: {(served,)}",
                              param=param)
