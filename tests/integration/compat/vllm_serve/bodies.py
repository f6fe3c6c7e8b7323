"""The bodies the compat tests send to both servers: chats (text, an image, tools, a request's
own chat templates) and completions' prompts."""

from __future__ import annotations

import base64
import io

from tests.pictures import picture

buffer = io.BytesIO()
picture(9, 80, 64).save(buffer, format="PNG")
IMAGE_URL = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
TEXT = [{"role": "user", "content": "tell me about the sea"}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
            {"type": "text", "text": "what is in this picture?"},
        ],
    }
]
GREEDY = {"model": "tiny", "messages": IMAGE, "max_tokens": 10, "temperature": 0}
CHAT = [*IMAGE, {"role": "assistant", "content": "It shows"}]
# vLLM's beam search: the n best beams, best first.
BEAMS = {**GREEDY, "use_beam_search": True, "n": 4}
# Special tokens of the tiny model's vocabulary pushed into the answer.
SPECIALS = {"388": 30.0, "390": 30.0}
# A strict tool: its call's arguments are held to the schema, so even the random tiny model's
# call is short, valid JSON under tool_choice required or named.
VERDICT = {
    "type": "function",
    "function": {
        "name": "verdict",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "verdict"}}
TOOL_GREEDY = {**GREEDY, "messages": TEXT, "max_tokens": 40, "tools": [VERDICT]}
CALLED = [
    *TEXT,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "verdict", "arguments": '{"ok": true}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call-1", "content": "recorded"},
]
# A continued assistant message that reads as a tool call: echo repeats it, the parser must not.
ECHOED_CALL = '<tool_call>\n{"name": "verdict", "arguments": {"ok": true}}\n</tool_call>\n'


# A request's own chat templates: one reading the content as parts (with the tiny model's image
# placeholder), one reading it as a string (vLLM's content formats "openai" and "string").
PARTS_TEMPLATE = (
    "{% for m in messages %}<<{{ m.role }}>>{% for p in m.content %}{% if p.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p.text }}{% endif %}{% endfor %}"
    "\n{% endfor %}{% if add_generation_prompt %}<<assistant>>{% endif %}"
)
STRING_TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"


PROMPT = {"model": "tiny", "prompt": "The sea is", "max_tokens": 8, "temperature": 0}
LONG_PROMPT = "The sea is deep and blue and the ships sail on it"
