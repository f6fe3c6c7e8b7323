"""The README's support table says what the model room serves: one row per family with its
name and architectures, and the families it names out of scope are refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from epd.server.models.registry import FAMILIES, UnsupportedModel, family_of

README = Path(__file__).resolve().parents[3] / "README.md"


def table_rows() -> list[list[str]]:
    section = README.read_text().split("## Models\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_family_has_its_row_and_no_row_names_a_family_that_is_not_served() -> None:
    served = {r[1]: r for r in table_rows() if r[1] != "out of scope" and not r[1].startswith("-")}
    assert {names(flag)[0] for flag in served} == {family.name for family in FAMILIES}
    for family in FAMILIES:
        row = served[f"`{family.name}`"]
        assert row[0] == family.title
        assert names(row[2]) == list(family.architectures)


@pytest.mark.parametrize("row", [r for r in table_rows() if r[1] == "out of scope"])
def test_families_out_of_scope_are_refused(tmp_path: Path, row: list[str]) -> None:
    for architecture in names(row[2]):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
        with pytest.raises(UnsupportedModel, match=f"{architecture} is not supported"):
            family_of(tmp_path)
