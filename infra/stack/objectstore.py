"""SeaweedFS with its S3 gateway: the durable storage under the broker."""

import contextlib
import json
import shutil
import signal
from pathlib import Path

from infra.errors import InfraError, StartTimeoutError
from infra.stack.service import Service

BUCKET = "tansu"
ACCESS_KEY = "tributary"
SECRET_KEY = "tributary-local-secret"  # loopback-only development credentials
REGION = "us-east-1"
# Below this much free space on its disk SeaweedFS marks every volume read-only, and the broker
# can then neither create a topic nor append. Its default is 1 % of the disk: 2.5 GB of a
# 252 GB disk, whatever the stack needs (a CI run failed that way with 1.3 GB free).
MIN_FREE_BYTES = 256 * 1024 * 1024

# Offsets from TRIBUTARY_OBJECTSTORE_INTERNAL_PORT.
_INTERNAL = {
    "master.port": 0,
    "master.port.grpc": 1,
    "volume.port": 2,
    "volume.port.grpc": 3,
    "filer.port": 4,
    "filer.port.grpc": 5,
    "s3.port.grpc": 6,
}
_TMP_SOCKETS = ("master-grpc", "volume-grpc", "filer-grpc", "s3-grpc", "filer", "s3")


def weed_binary() -> str | None:
    return shutil.which("weed") or _venv_binary("weed")


def _venv_binary(name: str) -> str | None:
    import sys

    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else None


class ObjectStoreService(Service):
    name = "objectstore"
    stop_signal = signal.SIGTERM
    stop_timeout = 30.0
    # A graceful stop takes 16 s: the filer's gRPC server waits 15 s for its own metadata
    # subscriptions to end. One process; when the data goes too, there is nothing to keep.
    discard_signal = signal.SIGKILL
    min_free_bytes = MIN_FREE_BYTES

    def __init__(self, home: Path, s3_port: int, internal_port: int) -> None:
        super().__init__(home)
        self.s3_port = s3_port
        self.internal_port = internal_port

    def _port(self, key: str) -> int:
        return self.internal_port + _INTERNAL[key]

    @property
    def filer_url(self) -> str:
        """The filer's HTTP API (``/buckets/<bucket>/...`` lists and deletes objects)."""
        return f"http://127.0.0.1:{self._port('filer.port')}"

    def ports(self) -> dict[int, str]:
        out = {self.s3_port: "TRIBUTARY_OBJECTSTORE_PORT"}
        for key in _INTERNAL:
            out[self._port(key)] = f"TRIBUTARY_OBJECTSTORE_INTERNAL_PORT (+{_INTERNAL[key]})"
        return out

    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def binaries(self) -> list[Path | str]:
        return [weed_binary() or "weed"]

    @property
    def identity_file(self) -> Path:
        return self.data_dir / "s3-identities.json"

    def prepare(self) -> None:
        (self.data_dir / "volumes").mkdir(parents=True, exist_ok=True)
        identities = {
            "identities": [
                {
                    "name": ACCESS_KEY,
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self.identity_file.write_text(json.dumps(identities))

    def argv(self) -> list[str]:
        argv = [
            weed_binary() or "weed",
            "-logtostderr",
            "server",
            f"-dir={self.data_dir / 'volumes'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=0",
            "-volume.preStopSeconds=1",
            f"-volume.minFreeSpace={MIN_FREE_BYTES // (1024 * 1024)}MiB",
            "-s3",
            f"-s3.port={self.s3_port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.identity_file}",
        ]
        argv += [f"-{key}={self._port(key)}" for key in _INTERNAL]
        return argv

    def _http(self, url: str, method: str = "GET") -> int:
        # Imported here: `status` of a stack that is down does not pay for them (~20 ms).
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, method=method)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, http.client.HTTPException):
            # Not up yet. A probe of a free port in the ephemeral range can even connect to
            # itself and read its own request back (BadStatusLine: "GET / HTTP/1.1").
            return 0

    def ready(self) -> bool:
        return self._http(f"{self.filer_url}/") == 200 and self._http(self.endpoint()) > 0

    def after_ready(self) -> None:
        """Create the broker's bucket."""
        self.create_bucket(BUCKET)

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a folder under the filer's /buckets); idempotent."""
        url = f"{self.filer_url}/buckets/{name}/?op=mkdir"
        status = self._http(url, method="POST")
        if status not in (200, 201, 409):
            raise StartTimeoutError(f"cannot create bucket {name!r} in SeaweedFS (HTTP {status})")

    def delete_bucket(self, name: str) -> None:
        """Remove a bucket and everything in it (a missing bucket is not an error)."""
        url = f"{self.filer_url}/buckets/{name}/?recursive=true"
        status = self._http(url, method="DELETE")
        if status not in (200, 202, 204, 404):
            raise InfraError(f"cannot delete bucket {name!r} in SeaweedFS (HTTP {status})")

    def cleanup_after_stop(self) -> None:
        ports = [self.s3_port, *(self._port(k) for k in _INTERNAL)]
        for kind in _TMP_SOCKETS:
            for port in ports:
                with contextlib.suppress(OSError):
                    Path(f"/tmp/seaweedfs-{kind}-{port}.sock").unlink()

    def s3_env(self) -> dict[str, str]:
        """What an S3 client (the broker) needs to reach this store."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT": self.endpoint(),
            "AWS_ALLOW_HTTP": "true",
        }
