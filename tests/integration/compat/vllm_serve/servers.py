"""The flags both servers run with, and what ``conftest.py``'s epd routes open beside their URL:
a route without the tool and trust flags, the gRPC endpoint, the encoder."""

from __future__ import annotations

from typing import Any

# The flags both servers run with, as vllm serve spells them.
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
TRUST_FLAG = "--trust-request-chat-template"


# epd's route URL -> the URL of a route beside it without the tool and trust flags.
FLAGLESS: dict[str, str] = {}
# epd's route URL -> the same route's gRPC endpoint.
GRPC: dict[str, str] = {}
# epd's route URL -> its encoder (none in EP/D).
ENCODERS: dict[str, Any] = {}
