"""The zip the driver ships to a cluster's executors: every module of Tributary's packages,
nothing else, and the same sources make the same zip under the same name."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from spark_streaming.shipping import PACKAGES, package_dir, write_zip

ROOT = Path(__file__).resolve().parents[3]


def modules(package: str) -> set[str]:
    root = package_dir(package)
    assert root is not None
    return {
        f"{package}/{p.relative_to(root).as_posix()}"
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def test_the_packages_are_the_distribution_s() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert set(PACKAGES) == {name.removesuffix("*") for name in include}
    # and the Makefile's, which `make setup` compiles to bytecode
    (line,) = [
        ln
        for ln in (ROOT / "Makefile").read_text().splitlines()
        if ln.startswith("PROJECT_PACKAGES")
    ]
    assert set(line.split("=", 1)[1].split()) == set(PACKAGES)


def test_every_module_of_every_package_and_nothing_else(tmp_path: Path) -> None:
    archive = write_zip(tmp_path)
    with zipfile.ZipFile(archive) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        folders = {n for n in z.namelist() if n.endswith("/")}
        assert z.testzip() is None
        assert z.read("projections/__init__.py") == (ROOT / "projections/__init__.py").read_bytes()
    assert len(names) == len(set(names)) and names == sorted(names)
    assert set(names) == set().union(*(modules(p) for p in PACKAGES))
    assert {"spark_streaming/kafka_source.py", "examples/social/views/__init__.py"} <= set(names)
    assert all(name.endswith(".py") and name.split("/")[0] in PACKAGES for name in names)
    assert folders == {n.rsplit("/", 1)[0] + "/" for n in names} | {f"{p}/" for p in PACKAGES}
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]  # no partial file left


def test_same_sources_same_name_and_bytes_changed_sources_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = write_zip(tmp_path / "a"), write_zip(tmp_path / "b")
    assert first.name == second.name and first.name.startswith("tributary-")
    assert first.read_bytes() == second.read_bytes()
    # a package of its own, in a tree of its own: one changed byte, another zip
    tree = tmp_path / "tree"
    (tree / "pkg_shipped").mkdir(parents=True)
    (tree / "pkg_shipped" / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tree))
    one = write_zip(tmp_path / "c", ["pkg_shipped"])
    assert write_zip(tmp_path / "c", ["pkg_shipped"]) == one
    (tree / "pkg_shipped" / "__init__.py").write_text("X = 2\n")
    two = write_zip(tmp_path / "c", ["pkg_shipped"])
    assert two.name != one.name and one.is_file()


def test_the_zip_alone_imports_tributary(tmp_path: Path) -> None:
    """With the zip first on the path, the packages are imported from it."""
    archive = write_zip(tmp_path)
    code = (
        f"import sys; sys.path.insert(0, {str(archive)!r});"
        " import projections, views, spark_streaming.kafka_source as k;"
        " import connectors.stores.protocol as s;"  # a namespace package (no __init__.py)
        " print(projections.__file__); print(k.__file__); print(s.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        f"{archive}/projections/__init__.py",
        f"{archive}/spark_streaming/kafka_source.py",
        f"{archive}/connectors/stores/protocol.py",
    ]
