"""A PostgreSQL cluster of the stack's own, with logical decoding on."""

import os
import pwd
import shutil
import signal
import stat
import subprocess
from pathlib import Path

from infra.errors import MissingBinaryError, StateFolderError
from infra.stack.service import Service

APP_DATABASE = "tributary"
SUPERUSER = "postgres"

SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "wal_sender_timeout": "60s",
}


class PostgresService(Service):
    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: a clean checkpoint without waiting for clients
    stop_timeout = 60.0

    def __init__(self, home: Path, port: int, bin_dir: Path, wal_budget_mb: int = 2048) -> None:
        super().__init__(home)
        self.port = port
        self.bin_dir = bin_dir
        self.wal_budget_mb = wal_budget_mb

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "data"

    def ports(self) -> dict[int, str]:
        return {self.port: "TRIBUTARY_POSTGRES_PORT"}

    def endpoint(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{APP_DATABASE}"

    def binaries(self) -> list[Path | str]:
        return [self.bin_dir / "postgres", self.bin_dir / "initdb"]

    def user(self) -> str | None:
        """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` OS user."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError as exc:
            raise MissingBinaryError(
                "running as root needs the `postgres` OS user to own the cluster; "
                "run `make setup` (it installs postgresql-15, which creates that user)"
            ) from exc
        return SUPERUSER

    def argv(self) -> list[str]:
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.cluster_dir), "-p", str(self.port)]
        for key, value in SERVER_SETTINGS.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def prepare(self) -> None:
        super().prepare()
        user = self.user()
        if user is not None:
            entry = pwd.getpwnam(user)
            _check_traversable(self.data_dir, entry.pw_uid)
            shutil.chown(self.data_dir, user, entry.pw_gid)
        if (self.cluster_dir / "PG_VERSION").exists():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            result = subprocess.run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.cluster_dir),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-instructions",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
                check=False,
            )
        if result.returncode != 0:
            raise StateFolderError(
                f"initdb failed (exit {result.returncode}) in {self.cluster_dir}; "
                f"see {self.log_path}"
            )

    def ready(self) -> bool:
        import psycopg  # imported here: `status` starts fast

        try:
            with psycopg.connect(self._dsn("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def after_ready(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (APP_DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{APP_DATABASE}"')
            # The WAL a replication slot may hold back (a connector that is down): past it the
            # slot is invalidated instead of filling the disk; CDC then recovers by a snapshot.
            # Set with ALTER SYSTEM (not -c) so an operator can still change it at run time.
            budget = "-1" if self.wal_budget_mb < 0 else f"{self.wal_budget_mb}MB"
            conn.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{budget}'")
            conn.execute("SELECT pg_reload_conf()")

    def _dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"


def _check_traversable(path: Path, uid: int) -> None:
    """The ``postgres`` user must reach its data folder through every parent folder."""
    for parent in path.resolve().parents:
        st = parent.stat()
        if st.st_uid == uid:
            continue
        if not st.st_mode & stat.S_IXOTH:
            raise StateFolderError(
                f"{parent} is not traversable by the postgres OS user, which runs the database "
                f"when Tributary runs as root; `chmod o+x {parent}` or set TRIBUTARY_HOME elsewhere"
            )
