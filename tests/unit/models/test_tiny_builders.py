"""The tiny builders' room: one builder per family, found by its name, and kept apart from
serving (no family carries builder code; no server imports the builders)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from epd.server.models.family import ModelFamily
from epd.server.models.registry import FAMILIES, UnsupportedModel
from epd.server.models.tiny.build import PRESETS
from epd.server.models.tiny.registry import BUILDERS, builder_named

# what `epd route|prefill|encode|decode` import, and the engines and tower they serve with
SERVING_MODULES = (
    "epd.server.route.cli",
    "epd.server.route.app",
    "epd.server.prefill.cli",
    "epd.server.prefill.app",
    "epd.server.encode.cli",
    "epd.server.encode.app",
    "epd.server.encode.vision",
    "epd.server.decode.cli",
    "epd.server.decode.app",
    "epd.server.engine.transformers_engine",
    "epd.server.engine.vllm_engine",
    "epd.server.engine.vllm_embeds",
)

PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
assert "epd.server.models.registry" in sys.modules, "the probe imported no family"
print("\\n".join(sorted(n for n in sys.modules if n.startswith("epd.server.models.tiny"))))
"""


def test_every_family_has_one_builder_registered_by_its_name() -> None:
    assert sorted(BUILDERS) == sorted(family.name for family in FAMILIES)
    for family in FAMILIES:
        assert builder_named(family.name).name == family.name


def test_a_builder_of_no_family_is_refused_naming_the_families() -> None:
    with pytest.raises(UnsupportedModel, match="unknown model family 'llama'; supported: Qwen2-VL"):
        builder_named("llama")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_a_family_carries_no_tiny_builder_code(family: ModelFamily) -> None:
    builder_members = [
        name
        for name in dir(family)
        if "tiny" in name or name in ("chat_template", "special_tokens", "named_tokens")
    ]
    assert builder_members == []


def test_serving_never_imports_the_tiny_builders() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, *SERVING_MODULES],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == []


def test_the_checkpoint_has_the_sizes_of_its_config(tiny_model_dir) -> None:
    sizes = PRESETS["tiny"]
    config = json.loads((tiny_model_dir / "config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]
    assert (text["hidden_size"], text["intermediate_size"]) == (
        sizes.hidden_size,
        sizes.intermediate_size,
    )
    assert (text["num_hidden_layers"], text["num_attention_heads"]) == (
        sizes.num_layers,
        sizes.num_heads,
    )
    assert text["num_key_value_heads"] == sizes.num_kv_heads
    assert (vision["depth"], vision["embed_dim"], vision["num_heads"]) == (
        sizes.vision_depth,
        sizes.vision_embed_dim,
        sizes.vision_num_heads,
    )
    assert vision["initializer_range"] == sizes.init_range
