"""A private PostgreSQL for the campaign: its own data folder (``initdb``) and port, so that
the nemesis can crash and restart it without disturbing anyone else's server."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bolide.facade.broker._process import free_port

__all__ = ["PrivatePostgres", "postgres_binaries"]


def postgres_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest Debian install), or ``None``."""
    installs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    found = [p for p in installs if (p / "initdb").exists() and (p / "pg_ctl").exists()]
    return found[-1] if found else None


class PrivatePostgres:
    """``initdb`` in a temporary folder, then ``pg_ctl`` on a free loopback port (trust)."""

    def __init__(self, log_path: Path) -> None:
        binaries = postgres_binaries()
        if binaries is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) under /usr/lib/postgresql")
        self.bin = binaries
        self.port = free_port()
        self.log_path = log_path
        self.folder = Path(tempfile.mkdtemp(prefix="bolide-chaos-pg-"))
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180)  # fmt: skip

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run("pg_ctl", action, "-D", str(self.folder / "data"), "-w", "-t", "120",
                  "-l", str(self.folder / "server.log"), "-o", options, *extra)  # fmt: skip

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run("initdb", "-D", str(self.folder / "data"), "-U", "postgres", "--auth=trust")
        self._ctl("start")

    def restart(self) -> None:
        """Crash the server (``immediate``: no checkpoint, as a kill) and start it again."""
        self._ctl("restart", "-m", "immediate")

    def stop(self) -> None:
        try:
            self._ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass  # not running
        finally:
            log = self.folder / "server.log"
            if log.exists():
                shutil.copy(log, self.log_path)
            shutil.rmtree(self.folder, ignore_errors=True)
