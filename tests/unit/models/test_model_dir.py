"""``resolve_model``: a directory as it is, a hub id through the hub cache, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from epd.server.models.model_dir import is_hub_id, resolve_model
from tests.hub_cache import place_in_hub_cache

REPO_ID = "epd-test/tiny-qwen2-vl"
MAIN = "a" * 40
TAGGED = "b" * 40


@pytest.fixture
def hub_cache(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding the tiny model as REPO_ID: main at MAIN, tag v1 at TAGGED; offline."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "hub"
    place_in_hub_cache(tiny_model_dir, cache, REPO_ID, commit=MAIN)
    place_in_hub_cache(tiny_model_dir, cache, REPO_ID, commit=TAGGED, revision="v1")
    return cache


def test_a_hub_id_resolves_to_its_snapshot_named_by_the_id(hub_cache: Path) -> None:
    model = resolve_model(REPO_ID, cache_dir=hub_cache)
    assert model.path.name == MAIN and model.path.is_relative_to(hub_cache)
    assert (model.path / "config.json").is_file()
    assert model.model_id == REPO_ID


def test_a_revision_picks_a_branch_tag_or_commit(hub_cache: Path) -> None:
    assert resolve_model(REPO_ID, "v1", cache_dir=hub_cache).path.name == TAGGED
    assert resolve_model(REPO_ID, MAIN, cache_dir=hub_cache).path.name == MAIN


def test_a_hub_id_missing_offline_names_the_id_and_revision(hub_cache: Path) -> None:
    with pytest.raises(ValueError, match="epd-test/absent \\(revision main\\): no such directory"):
        resolve_model("epd-test/absent", cache_dir=hub_cache)
    with pytest.raises(ValueError, match=f"{REPO_ID} \\(revision v2\\)"):
        resolve_model(REPO_ID, "v2", cache_dir=hub_cache)


def test_a_directory_passes_through_named_by_its_name(tiny_model_dir: Path) -> None:
    model = resolve_model(str(tiny_model_dir))
    assert model.path == tiny_model_dir and model.model_id == tiny_model_dir.name
    with pytest.raises(ValueError, match="--revision v1 is for hub ids"):
        resolve_model(str(tiny_model_dir), "v1")


def test_a_directory_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a model directory"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("name", ["nowhere", "./no/where", "/no/where", "a/b/c", "org/--x"])
def test_neither_a_directory_nor_a_hub_id_is_refused(name: str) -> None:
    assert not is_hub_id(name)
    with pytest.raises(ValueError, match="no such directory, nor a hub id of the form ORG/NAME"):
        resolve_model(name)
