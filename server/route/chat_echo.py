"""vLLM's ``echo`` for chat completions (no I/O): an answer starts with the last message's text
when that message's role is the answer's (``assistant``, or the last message's own role when the
generation prompt is not added), as vLLM's ``OpenAIServingChat`` writes it."""

from __future__ import annotations

from epd.server.route.request import ChatMessage


def echo_text(messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    """The text ``echo`` puts before each answer of a chat of ``messages`` ('' for none): the
    last message's text parts, one per line."""
    if not messages:
        return ""
    last = messages[-1]
    role = "assistant" if add_generation_prompt else last.role
    if last.role != role:
        return ""
    return "\n".join(part.text for part in last.parts if part.text is not None)
