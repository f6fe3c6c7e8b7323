"""The route's peers as in-memory fakes (``fake_scheduler``, ``fake_encoder``, ``fake_engines``;
no servers), a stub prompt builder, and routers over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models

from epd.common.tasks import BackgroundCalls
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.route.prompt import PromptBuilder, Rendered
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, new_request_id
from epd.server.route.router import Router
from epd.server.route.topology import RoleView
from tests.unit.route.fake_encoder import FakeEncoder
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler


@dataclass
class FakePeers:
    """``Peers`` with fakes behind each endpoint."""

    scheduler: FakeScheduler = field(default_factory=FakeScheduler)
    encoders: dict[str, FakeEncoder] = field(default_factory=dict)
    engines: dict[str, Any] = field(default_factory=dict)
    background: BackgroundCalls = field(default_factory=BackgroundCalls)
    roles: RoleView = field(default_factory=RoleView)

    def encoder(self, endpoint: str) -> FakeEncoder:
        return self.encoders.setdefault(endpoint, FakeEncoder(endpoint))

    def prefill(self, endpoint: str) -> FakeEngine:
        return self.engines.setdefault(endpoint, FakeEngine())

    def decode(self, endpoint: str) -> FakeEngine:
        return self.engines.setdefault(endpoint, FakeEngine())


class StubTokenizer:
    """Token i is the word ``str(i)``."""

    backend_tokenizer = Tokenizer(models.WordLevel({str(i): i for i in range(1024)}, "0"))


class StubPrompts:
    """A prompt builder for text-only requests: two tokens, no block hashes."""

    tokenizer = StubTokenizer()

    def num_chars(self, messages: Any) -> int:
        return 2

    def render(
        self,
        messages: Any,
        template_kwargs: Any = None,
        chat_template: Any = None,
        add_special_tokens: bool = False,
    ) -> Rendered:
        return Rendered("ab", [1, 2])

    def block_hashes(
        self,
        token_ids: list[int],
        images: Any,
        videos: Any = None,
        salt: str = "",
        param: str = "messages",
    ) -> list[int]:
        return []

    max_context_tokens = None

    def expanded_ids(self, token_ids: list[int], image_tokens: Any, video_tokens: Any) -> list[int]:
        return token_ids

    def video_tokens(self, plan: Any) -> Any:
        raise AssertionError("a text-only router loads no video")


def text_router(peers: FakePeers) -> Router:
    """A router for the model ``tiny`` serving text-only requests over ``peers``."""
    prompts: Any = StubPrompts()
    unused: Any = None  # NOTE: text only: no media to load, no image grids
    return Router(peers, prompts, unused, model_id="tiny", host_id="h", grids=unused)  # type: ignore[arg-type]


def model_router(peers: FakePeers, prompts: PromptBuilder, model_dir: Path) -> Router:
    """A router for the model ``tiny`` over ``peers``, with the real prompt builder, media rules
    and image grids of ``model_dir``."""
    loader = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")
    grids = ImageGridder(model_dir)
    return Router(peers, prompts, loader, model_id="tiny", host_id="h", grids=grids)  # type: ignore[arg-type]


def generate_request(model: str) -> ChatRequest:
    """A text-only request for ``model``."""
    return ChatRequest(new_request_id(), model, [ChatMessage("user", [ChatPart(text="hi")])])


async def generate(worker: Router, model: str) -> list[Any]:
    return [chunk async for chunk in worker.generate(generate_request(model), timeout_s=5)]
