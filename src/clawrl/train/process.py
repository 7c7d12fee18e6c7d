"""The trainer as a child process of `clawrl serve` (DESIGN §2: never inside the serving process).

The child is `python -m clawrl.cli train`, configured through `CLAWRL_*` environment variables
built from serve's own settings objects (so flags given to serve, its environment and its defaults
all reach the trainer the same way, and no secret such as a database URL shows up in `ps`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic_settings import BaseSettings

log = logging.getLogger(__name__)


def settings_env(*configs: BaseSettings) -> dict[str, str]:
    """`CLAWRL_<FIELD>` variables that rebuild these settings in another process."""
    env = {}
    for config in configs:
        for name, value in config.model_dump().items():
            if value is None:
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            env[f"CLAWRL_{name.upper()}"] = text
    return env


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """SIGTERM this process once `parent_pid` is gone (its parent changes), so a trainer never
    outlives a `clawrl serve` that was killed without the chance to stop it."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        log.warning("the serving process %d is gone; stopping the trainer", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="clawrl-parent-watch", daemon=True).start()


class TrainerProcess:
    """Start `clawrl train` with the given settings; `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, *configs: BaseSettings, stop_timeout_s: float = 15.0) -> None:
        self.env = {**os.environ, **settings_env(*configs)}
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> TrainerProcess:
        command = [sys.executable, "-m", "clawrl.cli", "train", "--parent-pid", str(os.getpid())]
        self.process = subprocess.Popen(command, env=self.env, cwd=Path.cwd())
        log.info("started the trainer (pid %d)", self.process.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """Ask the trainer to stop; a step in progress is lost (its samples stay ready)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> TrainerProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
