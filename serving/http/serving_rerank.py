"""POST /rerank, /v1/rerank and /v2/rerank (vLLM's rerank API, Jina's and
Cohere's shape, on an embedding model).

The ``query`` is scored against each of the ``documents`` as /score scores
a 1 to N request (``serving_score.pair_scores``: the cosine similarity of
the two embeddings; each text embedded once and counted in the metrics as
an embedding). ``results`` hold one ``{"index", "document": {"text"},
"relevance_score"}`` a document, ``index`` its place in ``documents``,
sorted by score, highest first (documents of equal score keep their
order), and cut to the first ``top_n`` where 0 < ``top_n`` < the number of
documents (vLLM's rule: 0 or less returns them all). ``return_documents``
false (Cohere's and Jina's field) leaves each result's ``document`` out.
``usage`` counts ``total_tokens`` (and ``prompt_tokens``, the same), each
pair's tokens as /score counts them. No documents, or an empty text, is a
400, as is a text the engine refuses.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from serving.http.serving_embedding import Int64, TruncatePromptTokens
from serving.http.serving_score import pair_scores
from serving.http.state import ServerState


class RerankRequest(BaseModel):
    """vLLM's body (``model``, ``query``, ``documents``, ``top_n``,
    ``truncate_prompt_tokens``, ``priority``, ``use_activation``: see
    ``serving_score``) and ``return_documents``; other fields are ignored,
    as vLLM ignores them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int = 0
    return_documents: bool = True
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    priority: Int64 = 0
    use_activation: bool | None = None


async def create_rerank(state: ServerState, request: RerankRequest) -> Response:
    state.check_model(request.model)
    documents = request.documents
    scores, pair_tokens = await pair_scores(state, ("query", [request.query]),
                                            ("documents", documents), request.model,
                                            request.truncate_prompt_tokens, request.priority,
                                            request.use_activation)
    order = sorted(range(len(documents)), key=lambda i: scores[i], reverse=True)
    if 0 < request.top_n < len(documents):
        order = order[:request.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": scores[i]}
        if request.return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    num_tokens = sum(pair_tokens)
    return JSONResponse({
        "id": f"rerank-{uuid.uuid4().hex}", "model": state.shown_model(request.model),
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        "results": results})
