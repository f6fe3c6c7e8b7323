"""Each family's tiny builder, found by the family's name."""

from __future__ import annotations

from epd.server.models.registry import family_named
from epd.server.models.tiny.builder import TinyBuilder
from epd.server.models.tiny.internvl import InternVlBuilder
from epd.server.models.tiny.llava import LlavaBuilder
from epd.server.models.tiny.llava_onevision import LlavaOnevisionBuilder
from epd.server.models.tiny.qwen2_vl import Qwen2_5VlBuilder, Qwen2VlBuilder
from epd.server.models.tiny.qwen3_vl import Qwen3VlBuilder

BUILDERS: dict[str, TinyBuilder] = {
    builder.name: builder
    for builder in (
        Qwen2VlBuilder(),
        Qwen2_5VlBuilder(),
        Qwen3VlBuilder(),
        LlavaBuilder(),
        LlavaOnevisionBuilder(),
        InternVlBuilder(),
    )
}


def builder_named(name: str) -> TinyBuilder:
    """The tiny builder of the family called ``name``; UnsupportedModel (a ValueError) naming
    the supported families if no family is called so."""
    return BUILDERS[family_named(name).name]
