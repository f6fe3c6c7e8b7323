"""What the stack's tests compare against: the monolithic reference's tokens, and the spans the
services exported."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from PIL import Image

from epd.server.engine.reference import ReferenceEngine
from tests.integration.e2e.launcher import Stack

QUESTION = "describe this picture"


def reference_tokens(model_dir: Path, images: list[Image.Image], max_tokens: int) -> list[int]:
    messages = [
        {
            "role": "user",
            "content": [*({"type": "image"} for _ in images), {"type": "text", "text": QUESTION}],
        }
    ]
    result = ReferenceEngine(model_dir).generate(
        messages, images, max_tokens=max_tokens, ignore_eos=True
    )
    return list(result.token_ids)


def read_spans(stack: Stack) -> list[dict[str, Any]]:
    lines = (stack.run_dir / "spans.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def span_tree(stack: Stack, request_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The spans of ``request_id``'s trace, once every server span's parent has been written
    (a background call's client span ends after its server span), or as they are at timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(stack)
        (root,) = [
            s
            for s in spans
            if s["name"] == "/epd.v1.RouteService/Generate"
            and s["attributes"].get("epd.request_id") == request_id
        ]
        tree = [s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]]
        ids = {s["context"]["span_id"] for s in tree}
        if time.monotonic() > deadline or all(
            s["parent_id"] in ids for s in tree if s["kind"] == "SpanKind.SERVER" and s is not root
        ):
            return tree
        time.sleep(0.2)
