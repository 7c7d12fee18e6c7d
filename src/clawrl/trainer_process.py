"""The trainer beside `clawrl serve` (DESIGN §2: never inside the serving process), kept running.

By default the trainer is a child process, `python -m clawrl.cli train`, configured through
`CLAWRL_*` environment variables built from serve's own settings objects (so flags given to serve,
its environment and its defaults all reach the trainer the same way, and no secret such as a
database URL shows up in `ps`). With `--placement ray` it is a Ray actor instead
(`cli/ray_trainer.py`), started through the `start_trainer` the supervisor is given; the
supervision (restarts, back-off, giving up, `status()`) is the same for both.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import SecretStr
from pydantic_settings import BaseSettings

from clawrl.restarts import RestartBackoff

log = logging.getLogger(__name__)


def settings_env(*configs: BaseSettings) -> dict[str, str]:
    """`CLAWRL_<FIELD>` variables that rebuild these settings in another process."""
    env = {}
    for config in configs:
        for name, value in config.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):  # the child's environment is as private as ours
                value = value.get_secret_value()
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


class TrainerHandle(Protocol):
    """A running trainer as the supervisor sees it: the part of `subprocess.Popen` it uses. `wait`
    and `poll` give the exit code, or for a trainer that is no process of ours, a line saying how it
    ended; `wait(timeout)` raises `subprocess.TimeoutExpired` when it is still running."""

    returncode: int | str | None

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> int | str | None: ...

    def wait(self, timeout: float | None = None) -> int | str: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class TrainerProcess:
    """Start `clawrl train` with the given settings and keep it running; `stop()` ends it.

    `start_trainer`: another way to start it (called for the first start and every restart), e.g. a
    Ray actor (`cli/ray_trainer.py`); unset, the child process. A handle with a `where` dict (the
    actor's id, its node) adds it to `status()`. `role`: what the log calls it (the judge actors of
    `cli/ray_judges.py` are supervised the same way).

    A trainer that dies (killed for memory, a crash) is started again after a pause that doubles
    with every quick failure (1 s, 2 s, 4 s, ... at most a minute): it resumes from the serving
    pointer and the samples still ready in the store, so nothing is trained twice. One that keeps
    dying within `healthy_after_s` of its start `max_quick_failures` times in a row (a bad setting,
    say) is given up on with an error in the log; serving and judging go on without it.
    """

    def __init__(self, *configs: BaseSettings, stop_timeout_s: float = 15.0, max_quick_failures: int = 5,
                 healthy_after_s: float = 60.0, start_trainer: Callable[[], TrainerHandle] | None = None,
                 role: str = "the trainer") -> None:
        self.env = {**os.environ, **settings_env(*configs)}
        self.start_trainer = start_trainer or self._start_process
        self.role = role
        self.stop_timeout_s = stop_timeout_s
        self.backoff = RestartBackoff(max_quick_failures, healthy_after_s)
        self.process: TrainerHandle | None = None
        self.restarts = 0  # how many times a dead trainer was started again
        self.given_up = False  # it kept dying and is not started again
        self._started_at = 0.0
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # between a restart and stop()

    def start(self) -> TrainerProcess:
        self._spawn()
        threading.Thread(target=self._supervise, name="clawrl-trainer-supervisor", daemon=True).start()
        return self

    def _start_process(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "clawrl.cli", "train", "--parent-pid", str(os.getpid())]
        # its own process group: Ctrl-C at a terminal reaches serve alone, which stops the trainer
        # itself once requests in flight have finished (before, the trainer died at once and the
        # supervisor started it again during the shutdown)
        return subprocess.Popen(command, env=self.env, cwd=Path.cwd(), process_group=0)

    def _spawn(self) -> None:
        self.process = self.start_trainer()
        self._started_at = time.monotonic()
        log.info("started %s (%s)", self.role, self._which())

    def _which(self) -> str:
        assert self.process is not None
        return getattr(self.process, "description", None) or f"pid {self.process.pid}"

    def _supervise(self) -> None:
        while True:
            assert self.process is not None
            returncode = self.process.wait()
            if self._stopping.is_set():
                return
            ran_s = time.monotonic() - self._started_at
            delay_s = self.backoff.pause_after_failure(ran_s)
            if delay_s is None:
                log.error("%s exited %d times in a row within %.0f s of starting (last: %s); not starting it "
                          "again: the other loops go on", self.role, self.backoff.quick_failures,
                          self.backoff.healthy_after_s, _ending(returncode))
                self.given_up = True
                return
            log.warning("%s (%s) ended after %.0f s (%s); starting it again in %.0f s",
                        self.role, self._which(), ran_s, _ending(returncode), delay_s)
            if self._stopping.wait(delay_s):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._spawn()
                except Exception:  # noqa: BLE001 - it could not even be started (a Ray cluster gone, say)
                    log.exception("could not start %s again", self.role)
                    self._started_at = time.monotonic()
                    continue  # a quick failure: the ended handle's `wait` returns at once, the back-off goes on
                self.restarts += 1

    @property
    def pid(self) -> int | None:
        """The trainer's process id (None while a Ray actor's is not known yet)."""
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self) -> dict[str, Any]:
        """What `/healthz` reports: is a trainer process alive, how often it was restarted, given up on
        (and, for a Ray actor, which actor on which node)."""
        where = getattr(self.process, "where", None) or {}
        return {"running": self.running(), "pid": self.process.pid if self.process else None,
                "restarts": self.restarts, "given_up": self.given_up, **where}

    def stop(self) -> int | str | None:
        """Ask the trainer to stop, for good; a step in progress is lost (its samples stay ready)."""
        with self._lock:
            self._stopping.set()
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


def _ending(returncode: int | str) -> str:
    return returncode if isinstance(returncode, str) else f"exit code {returncode}"
