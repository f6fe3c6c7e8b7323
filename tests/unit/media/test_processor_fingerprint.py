"""mm_hash names embeddings, so it changes with every processor setting a family's checkpoint
reads: the image processor's, whether it sits in ``preprocessor_config.json`` or (as
transformers 5 saves it) nested in ``processor_config.json``, and the processor's own."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from epd.server.media.hashing import processor_fingerprint
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.models.registry import FAMILIES

IMAGE = Image.new("RGB", (64, 48), (90, 120, 150))


def configs_of(family: str, tiny_family_dir: Callable[[str], Path], tmp_path: Path) -> Path:
    """The family's tiny checkpoint's JSON files (all a processor reads), copied."""
    copy = tmp_path / family
    copy.mkdir()
    for path in tiny_family_dir(family).glob("*.json"):
        shutil.copy(path, copy / path.name)
    return copy


def loaded_mean(model_dir: Path) -> list[float]:
    from transformers import AutoImageProcessor

    return list(AutoImageProcessor.from_pretrained(model_dir).image_mean)


def hash_of(model_dir: Path) -> str:
    """The image's mm_hash as the services' loader for ``model_dir`` names it."""
    png = io.BytesIO()
    IMAGE.save(png, format="PNG")
    loader = MediaLoader.for_model(MediaPolicy(), model_dir, model_id="m")
    return asyncio.run(loader.load(data=png.getvalue())).mm_hash


def edit(path: Path, change: Callable[[dict], None]) -> None:
    settings = json.loads(path.read_text())
    change(settings)
    path.write_text(json.dumps(settings))


@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_the_image_processor_setting_transformers_reads_changes_mm_hash(
    family: str, tiny_family_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """With both files present, transformers 5 reads the image processor nested in
    ``processor_config.json``; the fingerprint read ``preprocessor_config.json`` only, so a
    changed mean left mm_hash (and every cached embedding named by it) as it was."""
    model_dir = configs_of(family, tiny_family_dir, tmp_path)
    before, mean = hash_of(model_dir), loaded_mean(model_dir)

    edit(
        model_dir / "processor_config.json",
        lambda s: s["image_processor"].update(image_mean=[0.1, 0.2, 0.3]),
    )

    assert loaded_mean(model_dir) != mean
    assert hash_of(model_dir) != before


@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_a_setting_of_a_preprocessor_config_alone_changes_mm_hash(
    family: str, tiny_family_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Hub checkpoints saved before transformers 5 keep the image processor in
    ``preprocessor_config.json`` alone."""
    model_dir = configs_of(family, tiny_family_dir, tmp_path)
    (model_dir / "processor_config.json").unlink()
    before, mean = hash_of(model_dir), loaded_mean(model_dir)

    edit(model_dir / "preprocessor_config.json", lambda s: s.update(image_mean=[0.1, 0.2, 0.3]))

    assert loaded_mean(model_dir) != mean
    assert hash_of(model_dir) != before


@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_a_processor_level_setting_changes_mm_hash(
    family: str, tiny_family_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Settings of the processor itself (LLaVA's ``vision_feature_select_strategy``, a patch
    size, the number of tokens per image) sit beside the image processor's."""
    model_dir = configs_of(family, tiny_family_dir, tmp_path)
    before = hash_of(model_dir)

    edit(model_dir / "processor_config.json", lambda s: s.update(epd_test_setting=1))

    assert hash_of(model_dir) != before


def test_equal_settings_give_equal_fingerprints_whatever_the_key_order(tmp_path: Path) -> None:
    for name, order in (("a", ["x", "y"]), ("b", ["y", "x"])):
        (tmp_path / name).mkdir()
        settings = {key: {"x": 1, "y": 2}[key] for key in order}
        (tmp_path / name / "preprocessor_config.json").write_text(json.dumps(settings))
    assert processor_fingerprint(tmp_path / "a") == processor_fingerprint(tmp_path / "b")
