"""The lines of an OpenAI batch file, as vLLM's ``run-batch`` reads and
writes them.

An input line is one request: ``{"custom_id": str, "method": str, "url":
str, "body": {...}}`` (other keys are ignored, as vLLM ignores them; the
method goes to the app as given, so one other than POST gets the
server's 405). An
output line answers one input line: ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``, written as vLLM writes
its ``BatchRequestOutput``:

- an answer (status 200): ``body`` the route's JSON answer, ``error`` null;
- a refusal of the route (any other status): ``body`` null, ``error`` the
  route's OpenAI error body (``{"error": {"message", "type", "param",
  "code"}}``), ``status_code`` the route's HTTP status;
- a request that never reached a route (an url not served, an url the
  model does not serve, a streaming request, a line that is not a batch
  request): status 400, ``body`` null, ``error`` a message (a string).

The urls are vLLM's (chat, embeddings, score at ``/score`` and
``/v1/score``, rerank at ``/rerank``, ``/v1/rerank`` and ``/v2/rerank``),
OpenAI's ``/v1/completions`` and the classification route ``/classify``
(vLLM serves it at that path only); each line's body is the request of its
url's route. A generating model answers the generation urls, an embedding
model (``--runner pooling``) the embeddings, score and rerank urls, a
classifier the classification, score and rerank urls (``model_urls``); a
line naming one of the others gets vLLM's "The model does not support ...
API" error (Chat Completions, Completions, Embeddings, Scores, Rerank,
Classification), as vLLM answers a line whose url's API the model lacks
(the app would answer 404: the route is not registered for the model).

``id`` and ``request_id`` are fresh random ids (vLLM's ``vllm-`` prefixes
spelled ``tprun-``). A line that is not a batch request has its own
``custom_id`` when it is an object that gives a string one, else null
(vLLM stops the whole run at such a line; here it is answered in its
place and the other lines run).

An input line is read from its bytes by the app's JSON reader
(``json_body.read_json``), as vLLM reads it with pydantic's: a line that
is not UTF-8, or whose JSON holds a lone surrogate (``"\\ud800"``), is
not a batch request. So every string of a batch request is Unicode text,
and its output line (its ``custom_id``, its url in an error) can be
written as UTF-8.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from serving.http.json_body import read_json

# The urls a batch line may name, each with its API's name in vLLM's error
# for a model that does not serve it: vLLM's (chat, embeddings, score and
# rerank, each of these two under the paths the app serves it at), the
# other one of OpenAI's batch format that tprun serves, and classification.
BATCH_URLS = {"/v1/chat/completions": "Chat Completions", "/v1/completions": "Completions",
              "/v1/embeddings": "Embeddings", "/score": "Scores", "/v1/score": "Scores",
              "/rerank": "Rerank", "/v1/rerank": "Rerank", "/v2/rerank": "Rerank",
              "/classify": "Classification"}
GENERATION_URLS = ("/v1/chat/completions", "/v1/completions")
# Both pooling tasks score pairs: by embeddings, or as a cross-encoder.
SCORE_URLS = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")
POOLING_URLS = {"embed": ("/v1/embeddings", *SCORE_URLS), "classify": ("/classify", *SCORE_URLS)}

STREAM_REFUSED = "Request must not be sent in stream mode"

# (key, type, the type's name in a message), in the order they are checked.
_FIELDS = (("custom_id", str, "a string"), ("method", str, "a string"),
           ("url", str, "a string"), ("body", dict, "an object"))

# json.dumps of an output line: compact, as pydantic's model_dump_json.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class BatchRequest:
    """An input line that is a batch request."""

    custom_id: str
    method: str
    url: str
    body: dict


class NotABatchRequest(ValueError):
    """An input line that is not a batch request; ``custom_id`` its own when
    it gives one (a string), else None."""

    def __init__(self, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.custom_id = custom_id


def read_line(raw: bytes) -> BatchRequest:
    """The batch request of one input line (its bytes); ``NotABatchRequest``
    saying why for JSON that does not parse (not UTF-8, a lone surrogate
    included), is not an object, or lacks a field (or has one of another
    type)."""
    try:
        line = read_json(raw)
    except ValueError as e:
        raise NotABatchRequest(f"not valid JSON ({e})") from None
    if not isinstance(line, dict):
        raise NotABatchRequest(f"a JSON object is expected, got {type(line).__name__}")
    custom_id = line.get("custom_id")
    custom_id = custom_id if isinstance(custom_id, str) else None
    for key, kind, name in _FIELDS:
        if key not in line:
            raise NotABatchRequest(f"the field {key!r} is missing", custom_id)
        if not isinstance(line[key], kind):
            raise NotABatchRequest(f"the field {key!r} must be {name}", custom_id)
    return BatchRequest(custom_id, line["method"], line["url"], line["body"])


def model_urls(pooling: bool, pooling_task: str = "embed") -> tuple[str, ...]:
    """The urls a model answers, as the app registers its routes: a
    generating model's the generation urls; a pooling model's, by its task,
    the embeddings or the classification url, and the score and rerank
    urls."""
    return POOLING_URLS[pooling_task] if pooling else GENERATION_URLS


def unserved_url(url: str) -> str:
    """The error of a line whose url is not one of ``BATCH_URLS``."""
    return f"URL {url} was used. Supported endpoints: {', '.join(BATCH_URLS)}."


def unsupported_api(url: str) -> str:
    """The error of a line whose url (one of ``BATCH_URLS``) the model does
    not answer (vLLM's message)."""
    return f"The model does not support {BATCH_URLS[url]} API"


def answered(custom_id: str, status: int, body) -> str:
    """The output line of a route's answer: its JSON ``body`` under status 200,
    else the route's error body under ``status``."""
    if status == 200:
        return _line(custom_id, 200, body, None)
    return _line(custom_id, status, None, body)


def failed(custom_id: str | None, message: str) -> str:
    """The output line of a request that did not reach a route (status 400)."""
    return _line(custom_id, 400, None, message)


def _line(custom_id, status: int, body, error) -> str:
    return _ENCODER.encode({
        "id": f"tprun-{uuid.uuid4().hex}", "custom_id": custom_id,
        "response": {"status_code": status, "request_id": f"tprun-batch-{uuid.uuid4().hex}",
                     "body": body},
        "error": error})
