"""docs/settings.md is the one table of settings: every field of the settings is in it."""

import re
from pathlib import Path

from infra.settings import Settings
from infra.settings_light import FIELDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def documented() -> set[str]:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `TRIBUTARY_")]
    return {
        name
        for row in rows
        for name in re.findall(r"`(TRIBUTARY_[A-Z0-9_]+)`", row.split(" | ")[0])
    }


def test_every_setting_has_a_row_in_the_one_table() -> None:
    names = {f"TRIBUTARY_{field.upper()}" for field in Settings.model_fields}
    assert names == {f"TRIBUTARY_{field.upper()}" for field in FIELDS}
    missing = sorted(names - documented())
    assert not missing, f"not in docs/settings.md: {missing}"


def test_the_table_names_no_setting_that_does_not_exist() -> None:
    known = {f"TRIBUTARY_{field.upper()}" for field in Settings.model_fields}
    others = {
        "TRIBUTARY_CONFIG_FILE",
        "TRIBUTARY_CONTAINER_ENGINE",
        "TRIBUTARY_IMAGE_BASE",
        "TRIBUTARY_PODMAN_HOME",
    }
    unknown = sorted(
        n for n in documented() - known - others if not n.startswith("TRIBUTARY_TEST_")
    )
    assert not unknown, f"docs/settings.md names settings that do not exist: {unknown}"


def test_no_other_table_of_settings() -> None:
    root = DOC.parents[1]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if page == DOC:
            continue
        rows = [ln for ln in page.read_text().splitlines() if ln.startswith("| `TRIBUTARY_")]
        assert not rows, f"{page.name} has a table of settings: keep them in docs/settings.md"
