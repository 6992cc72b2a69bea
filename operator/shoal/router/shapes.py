"""The conversation a generating request starts with, whatever API it came by.

Chat, the Responses API and Anthropic's Messages API are all rendered by the
engine's chat template from a list of role/content messages: vLLM turns a
Responses `instructions` and a Messages `system` into the leading system
message, and their `input` / `messages` into the turns after it. So the router
normalizes all three to chat's `messages` and renders that one form: a system
prompt shared across APIs has the same routing text, the same prefix hashes,
and lands on the replica that already caches it. A completion's prompt is
text of its own (no template), rendered as before.
"""

from __future__ import annotations

import enum
from typing import Any

from shoal.router.prefix import render_prompt

JsonDict = dict[str, Any]


class Shape(enum.Enum):
    """How a route's request body holds its prompt."""

    CHAT = "chat"  # messages
    COMPLETION = "completion"  # prompt
    RESPONSES = "responses"  # instructions + input (a string or a list of items)
    MESSAGES = "messages"  # Anthropic: system + messages
    NONE = "none"  # no prompt worth routing on


# Fields that change what the template renders: carried into the chat form,
# so hot prefixes skip such requests as they skip chat ones with tools.
_TEMPLATE_FIELDS = ("tools", "chat_template", "chat_template_kwargs")


def chat_form(shape: Shape, body: JsonDict) -> JsonDict | None:
    """The request as chat `messages` (with its template-changing fields), or
    None for a shape without a conversation."""
    if shape is Shape.CHAT:
        return body
    if shape is Shape.RESPONSES:
        messages = _system(body.get("instructions")) + _responses_input(body.get("input"))
    elif shape is Shape.MESSAGES:
        messages = _system(body.get("system")) + _plain_messages(body.get("messages"))
    else:
        return None
    form: JsonDict = {"messages": messages}
    for field in _TEMPLATE_FIELDS:
        if body.get(field):
            form[field] = body[field]
    return form


def routing_text(shape: Shape, body: JsonDict) -> str:
    """The text the router hashes for cache-aware routing."""
    if shape is Shape.COMPLETION:
        return render_prompt(body)
    form = chat_form(shape, body)
    return render_prompt(form) if form is not None else ""


def _text(content: Any) -> str:
    """A content's text: a string, or the text of its parts (chat's `text`,
    Responses' `input_text` / `output_text`, Anthropic's `text` blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _system(value: Any) -> list[JsonDict]:
    text = _text(value)
    return [{"role": "system", "content": text}] if text else []


def _plain_messages(messages: Any) -> list[JsonDict]:
    if not isinstance(messages, list):
        return []
    return [
        {"role": str(m.get("role", "")), "content": _text(m.get("content"))}
        for m in messages
        if isinstance(m, dict)
    ]


def _responses_input(value: Any) -> list[JsonDict]:
    """A Responses `input`: a string is one user turn; a list holds message
    items (`{"role", "content"}`, with or without `"type": "message"`) and
    other items (function calls and their outputs), which end the part of the
    conversation the router can render the way the template will."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        return []
    messages = []
    for item in value:
        if not isinstance(item, dict) or "role" not in item:
            break
        if item.get("type", "message") != "message":
            break
        messages.append({"role": str(item["role"]), "content": _text(item.get("content"))})
    return messages
