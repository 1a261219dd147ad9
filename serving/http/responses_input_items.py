"""A stored response's input items, as OpenAI's ``GET
/v1/responses/{id}/input_items`` lists them: made when the response is
stored, paged when they are listed.

The items are the context the response was generated from, without its
``instructions`` (which are no item, and do not carry over): after
``previous_response_id``, that response's input items and then its output
items, as they were answered; then the request's own ``input``. Each is
one of OpenAI's item types with an ``id`` unique in the list:

- a user, system or developer message: ``{"id": "msg_<hex>", "type":
  "message", "role", "status": "completed", "content": [{"type":
  "input_text", "text"}, ...]}`` (a text input is one user message of one
  part);
- an assistant message: the same with ``output_text`` parts (``text``,
  ``annotations`` [], ``logprobs`` []);
- a ``function_call`` (``call_id``, ``name``, ``arguments``, ``status``)
  and a ``function_call_output`` (``call_id``, ``output``: its text or
  ``input_text`` parts, ``status`` "completed", id ``fco_<hex>``);
- a ``reasoning`` item (id ``rs_<hex>``): its ``summary`` parts, its
  ``content`` parts where it has them, and its ``status``.

An item the client gave an ``id`` (an earlier output item sent back) keeps
it, unless the list already has it; a given ``status`` is kept where it is
one of OpenAI's. The items are read after ``responses_input.input_messages``
has accepted them, so every field they need is there.

Listing (``InputItemsQuery``, OpenAI's query): ``order`` "desc" (the
default: newest first) or "asc", at most ``limit`` items (1 to 100, 20 by
default) after the item ``after``; the page is ``{"object": "list",
"data", "first_id", "last_id", "has_more"}`` (ids null for an empty
page). ``include`` takes the values a Response's ``include`` takes; only
"message.output_text.logprobs" changes the page: without it the output
texts of earlier answers show no logprobs, as those answers showed none
unless asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from serving.http.protocol import INCLUDABLE, OUTPUT_LOGPROBS, FieldError, ResponseInputItem
from serving.http.response_store import StoredResponse
from serving.http.responses_output import new_id

ORDERS = ("desc", "asc")
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
STATUSES = ("in_progress", "completed", "incomplete")
ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
               "reasoning": "rs"}


def stored_input_items(previous: StoredResponse | None,
                       given: str | list[ResponseInputItem]) -> list[dict]:
    """The input items of a response to ``given`` after ``previous`` (None:
    no previous_response_id)."""
    earlier = [] if previous is None else [*previous.input_items, *previous.body["output"]]
    taken = {item["id"] for item in earlier}
    if isinstance(given, str):
        return [*earlier, _message(new_id("msg"), "user", "completed", given)]
    return [*earlier, *(_item(item, taken) for item in given)]


def _item(item: ResponseInputItem, taken: set[str]) -> dict:
    extra = item.model_extra or {}
    item_id = extra.get("id")
    if not isinstance(item_id, str) or not item_id or item_id in taken:
        item_id = new_id(ID_PREFIXES[item.type])
    taken.add(item_id)
    status = extra.get("status") if extra.get("status") in STATUSES else "completed"
    if item.type == "message":
        return _message(item_id, item.role, status, item.content)
    if item.type == "function_call":
        return {"id": item_id, "type": "function_call", "call_id": item.call_id,
                "name": item.name, "arguments": item.arguments, "status": status}
    if item.type == "reasoning":
        return _reasoning(item_id, status, item)
    output = item.output if isinstance(item.output, str) else \
        [{"type": "input_text", "text": part.text} for part in item.output]
    return {"id": item_id, "type": "function_call_output", "call_id": item.call_id,
            "output": output, "status": "completed"}


def _reasoning(item_id: str, status: str, item: ResponseInputItem) -> dict:
    summary = (item.model_extra or {}).get("summary") or []
    reasoning = {"id": item_id, "type": "reasoning", "status": status,
                 "summary": [{"type": "summary_text", "text": part["text"]} for part in summary]}
    if item.content:
        texts = [item.content] if isinstance(item.content, str) else [
            part.text for part in item.content]
        reasoning["content"] = [{"type": "reasoning_text", "text": text} for text in texts]
    return reasoning


def _message(item_id: str, role: str, status: str, content) -> dict:
    texts = [content] if isinstance(content, str) else [part.text for part in content]
    if role == "assistant":
        parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                 for text in texts]
    else:
        parts = [{"type": "input_text", "text": text} for text in texts]
    return {"id": item_id, "type": "message", "role": role, "status": status, "content": parts}


@dataclass(frozen=True)
class InputItemsQuery:
    order: str = "desc"
    limit: int = DEFAULT_LIMIT
    after: str | None = None
    logprobs: bool = False  # include "message.output_text.logprobs"


def read_query(params: Mapping[str, str], include: list[str]) -> InputItemsQuery:
    """The listing's query parameters (``include``: its values, sent as
    ``include`` or, by the ``openai`` client, ``include[]``);
    ``FieldError`` naming a bad one."""
    order = params.get("order", "desc")
    if order not in ORDERS:
        raise FieldError("order", f'order must be "asc" or "desc", got {order!r}')
    limit = params.get("limit", str(DEFAULT_LIMIT))
    count = _count(limit)
    if count is None:
        raise FieldError("limit", f"limit must be a whole number from 1 to {MAX_LIMIT}, "
                                  f"got {limit!r}")
    for i, value in enumerate(include):
        if value not in INCLUDABLE:
            raise FieldError(f"include.{i}", f"include {value!r} is not supported by this "
                                             f"server (it takes {', '.join(INCLUDABLE)})")
    return InputItemsQuery(order, count, params.get("after"), OUTPUT_LOGPROBS in include)


def _count(limit: str) -> int | None:
    """``limit`` as a count from 1 to ``MAX_LIMIT`` in ASCII digits (spaces
    around allowed); None for anything else. The digits are checked before
    ``int`` reads them: it refuses some characters ``str.isdigit`` takes
    (superscripts) and numbers past its limit of digits."""
    text = limit.strip()
    if not text.isascii() or not text.isdigit() or len(text.lstrip("0")) > len(str(MAX_LIMIT)):
        return None
    count = int(text)
    return count if 1 <= count <= MAX_LIMIT else None


def items_page(items: list[dict], query: InputItemsQuery) -> dict:
    """One page of ``items`` (oldest first) as the query asks for it;
    ``FieldError`` for an ``after`` that is no item of the list."""
    ordered = items if query.order == "asc" else items[::-1]
    start = 0
    if query.after is not None:
        ids = [item["id"] for item in ordered]
        if query.after not in ids:
            raise FieldError("after", f"after must be the id of one of the response's input "
                                      f"items, got {query.after!r}")
        start = ids.index(query.after) + 1
    data = [_shown(item, query.logprobs) for item in ordered[start:start + query.limit]]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + query.limit < len(ordered)}


def _shown(item: dict, logprobs: bool) -> dict:
    """The item as listed: an output text's logprobs only where asked."""
    if logprobs or item["type"] != "message" or item["role"] != "assistant":
        return item
    return {**item, "content": [{**part, "logprobs": []} if part["type"] == "output_text"
                                else part for part in item["content"]]}
