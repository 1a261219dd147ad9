"""A request's own chat template, served only where the server trusts it.

vLLM's chat and ``/tokenize`` requests may bring the template their
messages are rendered with: the ``chat_template`` field, or the
``chat_template`` key of ``chat_template_kwargs`` (which vLLM reads as the
template too, and which the Responses API's ``chat_template_kwargs`` can
carry). As in vLLM, a server serves it only when started with
``--trust-request-chat-template``; otherwise a request that brings one is
refused with vLLM's message, whatever the template, so a client learns
that the server would not render it rather than getting the server's
template instead. A served one renders through the one renderer the
model's template takes (``checkpoint.chat_template``: jinja2's immutable
sandbox, where a template reaches its variables and nothing else); one
that does not compile or fails on the messages is that request's 400.
Trusting them lets any client spend the server's time on a template, as
in vLLM.

Which template, as vLLM picks it: the field (an empty one is no
template, vLLM's ``or``), else the server's ``--chat-template``, else the
key. vLLM's renderer gives the template it resolved from the field and
the server's over the kwargs' key, so on a server started with
``--chat-template`` the key alone changes nothing (but is still refused
where the server does not trust request templates); without one, the key
stands in for the model's template. Either way the key is never one of
the template's variables (``template_variables``).
"""

from __future__ import annotations

from typing import Any

from serving.http.protocol import FieldError

# vLLM's words for a request template the server does not trust.
UNTRUSTED = ("Chat template is passed with request, but --trust-request-chat-template is not "
             "set. Refused request with untrusted chat template.")


def request_template(chat_template: str | None, chat_template_kwargs: dict[str, Any] | None,
                     trusted: bool, server_template: str | None = None) -> str | None:
    """The template the request's messages are rendered with (None: the
    model's); ``server_template``: the server's ``--chat-template`` (None
    without one). ``FieldError``: vLLM's message where the request brings
    one (as ``chat_template`` or in ``chat_template_kwargs``, the field
    named) and the server does not trust it, or a key that is no text."""
    from_kwargs = (chat_template_kwargs or {}).get("chat_template")
    if not trusted and (chat_template is not None or from_kwargs is not None):
        param = "chat_template" if chat_template is not None else "chat_template_kwargs"
        raise FieldError(param, UNTRUSTED)
    if from_kwargs is not None and not isinstance(from_kwargs, str):
        raise FieldError("chat_template_kwargs.chat_template",
                         "chat_template_kwargs.chat_template must be a template's text")
    return chat_template or server_template or from_kwargs or None


def template_variables(chat_template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The template's variables a request's ``chat_template_kwargs`` give:
    all of them but ``chat_template``, which names the template
    (``request_template``). A new dict: the request's stays as sent."""
    return {k: v for k, v in (chat_template_kwargs or {}).items() if k != "chat_template"}
