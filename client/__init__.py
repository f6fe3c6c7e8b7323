"""epd's Python SDK: ``EpdClient`` (blocking) and ``AsyncEpdClient`` for the RouteService.

from epd.client import EpdClient, user

with EpdClient("127.0.0.1:50050") as client:
    for chunk in client.stream([user("What is in this picture?", image="cat.png")]):
        print(chunk.text, end="", flush=True)
"""

from epd.client.errors import (
    Cancelled,
    DeadlineExceeded,
    EpdClientError,
    InvalidRequest,
    Unauthenticated,
    Unavailable,
)
from epd.client.messages import (
    Candidate,
    Chunk,
    Message,
    Picture,
    Usage,
    Video,
    assistant,
    build_request,
    completions,
    system,
    tool,
    user,
)
from epd.client.options import RequestOptions
from epd.client.sdk import AsyncEpdClient
from epd.client.sync_client import EpdClient
from epd.client.tools import Tool, ToolCall

__all__ = [
    "AsyncEpdClient",
    "Cancelled",
    "Candidate",
    "Chunk",
    "DeadlineExceeded",
    "EpdClient",
    "EpdClientError",
    "InvalidRequest",
    "Message",
    "Picture",
    "RequestOptions",
    "Tool",
    "ToolCall",
    "Usage",
    "Video",
    "Unauthenticated",
    "Unavailable",
    "assistant",
    "build_request",
    "completions",
    "system",
    "tool",
    "user",
]
