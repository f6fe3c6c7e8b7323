#!/usr/bin/env python
"""Write docs/route.md's table of vLLM's OpenAI request fields and what epd does with each.

Every field of vLLM's ``ChatCompletionRequest`` and ``CompletionRequest`` (vLLM 0.32, in vLLM's
order), read off the code: answered where the route implements it (``openai_schema`` and
``openai_completions``' ``IMPLEMENTED_FIELDS``), taken with no effect where vLLM's generation
endpoints do nothing with it (``openai_schema.IGNORED_FIELDS``), else refused by name at any
value but its default; and, on a transformers engine, refused where it sets a sampling field
that engine does not implement (``engine/base.py``'s extended fields less
``engine/sampler.py``'s).
tests/unit/docs/test_route_fields.py fails when the table is stale, so a field lands in the docs
with its code.

    .venv/bin/python scripts/gen_route_fields.py           # rewrite the table in docs/route.md
    .venv/bin/python scripts/gen_route_fields.py --check   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "route.md"
START = "<!-- request fields: scripts/gen_route_fields.py -->"
END = "<!-- end of request fields -->"
# A request field -> the engine's sampling field it sets, where an engine may not implement it.
ENGINE_FIELDS = {
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_p": "min_p",
    "min_tokens": "min_tokens",
    "logit_bias": "logit_bias",
    "bad_words": "bad_words",
    "allowed_token_ids": "allowed_token_ids",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "response_format": "structured_output",
    "structured_outputs": "structured_output",
    "tool_choice": "structured_output",
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "prompt_logprobs": "prompt_logprobs",
    "logprob_token_ids": "logprob_token_ids",
    "echo": "prompt_logprobs",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "thinking_token_budget": "thinking_token_budget",
    "repetition_detection": "repetition_detection",
    "vllm_xargs": "vllm_xargs",
}
REFUSED = "400 `UNSUPPORTED_PARAMETER` unless default"
IGNORED = "taken, no effect (as vLLM's generation endpoints)"


def rows() -> list[tuple[str, str, str, str]]:
    """(field, chat, completions, transformers engine) for every field of the two requests."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from epd.server.engine.base import EXTENDED_SAMPLING_FIELDS
    from epd.server.engine.sampler import IMPLEMENTED_FIELDS as TRANSFORMERS_FIELDS
    from epd.server.route.openai_completions import IMPLEMENTED_FIELDS as COMPLETION_FIELDS
    from epd.server.route.openai_schema import IGNORED_FIELDS
    from epd.server.route.openai_schema import IMPLEMENTED_FIELDS as CHAT_FIELDS

    chat, completion = ChatCompletionRequest.model_fields, CompletionRequest.model_fields
    names = list(chat) + [name for name in completion if name not in chat]
    table = []
    for name in names:
        answers = [
            ""
            if name not in fields
            else "yes"
            if name in implemented
            else IGNORED
            if name in IGNORED_FIELDS
            else REFUSED
            for fields, implemented in ((chat, CHAT_FIELDS), (completion, COMPLETION_FIELDS))
        ]
        engine_field = ENGINE_FIELDS.get(name)
        if "yes" not in answers:
            transformers = ""
        elif engine_field in EXTENDED_SAMPLING_FIELDS and engine_field not in TRANSFORMERS_FIELDS:
            transformers = f"400 `UNSUPPORTED_PARAMETER`, param `{engine_field}`"
        else:
            transformers = "yes"
        table.append((f"`{name}`", *answers, transformers))
    return table


def render(table: list[tuple[str, str, str, str]]) -> str:
    """The table, between its markers."""
    lines = [
        START,
        "| field | `/v1/chat/completions` | `/v1/completions` | on a transformers engine |",
        "|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in table),
        END,
    ]
    return "\n".join(lines)


def rewritten(text: str) -> str:
    """``text`` (docs/route.md) with its table replaced by the one the code gives."""
    start, end = text.index(START), text.index(END) + len(END)
    return text[:start] + render(rows()) + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the table is stale")
    args = parser.parse_args()
    text = DOC.read_text()
    new = rewritten(text)
    if args.check:
        if new != text:
            print("docs/route.md's field table is stale: run scripts/gen_route_fields.py")
        return int(new != text)
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
