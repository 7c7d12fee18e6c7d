"""A real PostgreSQL server for the tests, from Debian's `postgresql` package: initdb in a temp dir,
started on a free loopback port, one fresh database per test. Skips where the server binaries are
not installed (`.ci/run` installs them)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawrl.serve.runner import free_port


def server_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<major>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3]))
    return Path(found[-1]).parent if found else None


def _as_server_user(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root; as root, run them as the package's `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    def __init__(self, root: Path) -> None:
        binaries = server_binaries()
        if binaries is None:
            pytest.skip("PostgreSQL server binaries not installed (Debian package `postgresql`)")
        self.binaries, self.root, self.data, self.port = binaries, root, root / "data", free_port()
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
            root.chmod(0o755)
        subprocess.run(_as_server_user([str(binaries / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "clawrl",
                                        "--no-sync"]), check=True, capture_output=True, cwd=root)  # fmt: skip
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.data / "server.log"),
                                        "-o", options, "-w", "start"]), check=True, capture_output=True, cwd=root)  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://clawrl@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=clawrl dbname=postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(_as_server_user([str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
                       capture_output=True, cwd=self.root)  # fmt: skip


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    # Not under pytest's tmp dir: that is private to the user running the tests (0700), and the
    # server runs as `postgres` when the tests run as root.
    root = Path(tempfile.mkdtemp(prefix="clawrl-postgres-"))
    try:
        server = PostgresServer(root)
        yield server
        server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()
