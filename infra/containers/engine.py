"""Which container engine runs the images: podman (with the settings ``make podman-setup``
wrote) or Docker. ``TRIBUTARY_CONTAINER_ENGINE`` chooses; otherwise a Docker engine that
answers wins (a laptop: no variables), else podman."""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.errors import InfraError

PODMAN_HOME = Path(
    os.environ.get("TRIBUTARY_PODMAN_HOME", Path.home() / ".cache" / "tributary-podman")
)


def podman_env_file() -> Path:
    return PODMAN_HOME / "env"


def read_env_file(path: Path) -> dict[str, str]:
    """``export NAME=value`` lines (what podman-setup.sh writes)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            name, value = line[len("export ") :].split("=", 1)
            out[name.strip()] = value.strip()
    return out


def load_podman_env() -> dict[str, str]:
    """Put podman-setup's variables into this process's environment (those not already set);
    returns what was added. Nothing when podman-setup never ran."""
    path = podman_env_file()
    if not path.exists():
        return {}
    added = {k: v for k, v in read_env_file(path).items() if k not in os.environ}
    os.environ.update(added)
    return added


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        done = subprocess.run([docker, "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@dataclass(frozen=True)
class Engine:
    binary: str  # podman or docker

    @property
    def is_podman(self) -> bool:
        return Path(self.binary).name == "podman"

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def run(self, args: list[str], check: bool = True, timeout: float | None = None) -> int:
        done = subprocess.run(
            [self.binary, *args], env=self.env, check=False, timeout=timeout, capture_output=True
        )
        if check and done.returncode != 0:
            raise InfraError(
                f"{self.binary} {' '.join(args)} failed ({done.returncode}): "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done.returncode

    def output(self, args: list[str]) -> str:
        done = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise InfraError(f"{self.binary} {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout.strip()

    def image_exists(self, ref: str) -> bool:
        return self.run(["image", "inspect", ref], check=False) == 0

    def image_id(self, ref: str) -> str:
        """The image's id without its ``sha256:`` prefix (Docker's CLI shows it, podman's not)."""
        image_id = self.output(["image", "inspect", "--format", "{{.Id}}", ref])
        return image_id.removeprefix("sha256:")

    def build(
        self, context: Path, tags: list[str], build_args: dict[str, str], labels: dict[str, str]
    ) -> None:
        argv = [self.binary, "build", "-f", str(context / "Containerfile")]
        if self.is_podman:  # podman's build containers have no network of their own here
            argv += ["--network=host"]
        for tag in tags:
            argv += ["-t", tag]
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        done = subprocess.run([*argv, str(context)], env=self.env, check=False)
        if done.returncode != 0:
            raise InfraError(f"building {tags[0]} failed ({done.returncode})")


def detect_engine() -> Engine:
    """``TRIBUTARY_CONTAINER_ENGINE`` (or ``TRIBUTARY_TEST_CONTAINER_ENGINE``, which the test
    suite keeps); else podman once ``make podman-setup`` ran (its API service may also answer
    the docker CLI: the images must be found by the same client); else a Docker engine that
    answers; else podman."""
    chosen = os.environ.get("TRIBUTARY_CONTAINER_ENGINE") or os.environ.get(
        "TRIBUTARY_TEST_CONTAINER_ENGINE"
    )
    if chosen is None:
        if shutil.which("podman") and podman_env_file().exists():
            chosen = "podman"
        elif _docker_answers():
            chosen = "docker"
        elif shutil.which("podman"):
            chosen = "podman"
        else:
            raise InfraError(
                "no container engine: install Docker, or run `make podman-setup` (Debian's podman)"
            )
    if chosen == "podman":
        load_podman_env()
    binary = shutil.which(chosen)
    if binary is None:
        raise InfraError(f"TRIBUTARY_CONTAINER_ENGINE={chosen}: {chosen} not found")
    return Engine(binary)
