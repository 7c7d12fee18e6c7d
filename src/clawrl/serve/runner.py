"""Run the server on a real port in a background thread of this process.

Used by the demo, the benchmarks and the tests: the same app and the same uvicorn as
`clawrl serve`, without a second process (and a second copy of the model).
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn

from clawrl.config import ServeConfig
from clawrl.engines.base import Engine
from clawrl.judge.worker import JudgeWorker
from clawrl.serve.app import create_app
from clawrl.store import Store
from clawrl.types import AdaptersMode


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerThread:
    """`with ServerThread(engine, store, config) as server:` serves at `server.base_url` until exit."""

    def __init__(
        self, engine: Engine, store: Store, config: ServeConfig | None = None, judge: JudgeWorker | None = None,
        adapters: AdaptersMode = "shared",
    ) -> None:
        config = config or ServeConfig(port=free_port())
        if config.port == 0:
            config = config.model_copy(update={"port": free_port()})
        self.config = config
        self.app = create_app(engine, store, config, judge, adapters=adapters)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=config.host, port=config.port, log_level="warning",
                                                    timeout_keep_alive=config.keep_alive_s))
        self._thread = threading.Thread(target=self._server.run, name="clawrl-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}/v1"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 120
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
