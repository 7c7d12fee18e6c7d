"""A request sent on a keep-alive connection idle for about 5 s failed (found by benchmarks/soak.py).

uvicorn closes a keep-alive connection idle for `timeout_keep_alive` (by default 5 s). httpx, and
so the openai SDK built on it, keeps an idle connection for reuse up to its `keepalive_expiry`,
whose default is also 5 s. A request written to a connection at the moment the server closes it
is never read: the client gets `httpx.ReadError('')` (the SDK's APIConnectionError) for a request
the server never saw. `clawrl serve` now keeps idle connections open `--keep-alive-s` (75 s).

This starts `clawrl serve` (tiny model, no trainer; `--server-keep-alive-s` passed on as
`--keep-alive-s` when given), keeps it busy with `--busy` clients, and has `--probes` clients each
send a request, wait a random 4.97-5.03 s on the same connection, and send another. It reports how
many second requests failed and whether any of them was recorded (none ever was: the turns in the
store equal the answers received), and exits 1 when any failed.

    python benchmarks/keepalive_race.py --server-keep-alive-s 5   # as before the fix: 18 of some 500 probes failed here
    python benchmarks/keepalive_race.py                           # the server's default (75 s): none fail
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from clawrl.serve.runner import free_port
from clawrl.sim.tiny import build_tiny_model

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def race(root: str, seconds: float, busy: int, probes: int, keepalive_expiry_s: float) -> dict[str, Any]:
    answered, failed = 0, []
    deadline = time.monotonic() + seconds

    async def keep_busy() -> None:
        nonlocal answered
        async with httpx.AsyncClient(base_url=root, timeout=120) as http:
            while time.monotonic() < deadline:
                status = (await http.post("/v1/chat/completions", json=BODY)).status_code
                answered += status == 200

    async def probe(index: int) -> None:
        nonlocal answered
        rng = random.Random(index)
        limits = httpx.Limits(max_connections=1, keepalive_expiry=keepalive_expiry_s)
        async with httpx.AsyncClient(base_url=root, timeout=120, limits=limits) as http:
            while time.monotonic() < deadline:
                status = (await http.post("/v1/chat/completions", json=BODY)).status_code
                answered += status == 200
                idle = rng.uniform(4.97, 5.03)
                await asyncio.sleep(idle)
                try:
                    status = (await http.post("/v1/chat/completions", json=BODY)).status_code
                    answered += status == 200
                except httpx.HTTPError as error:
                    failed.append({"idle_s": round(idle, 3), "error": repr(error)})

    await asyncio.gather(*(keep_busy() for _ in range(busy)), *(probe(index) for index in range(probes)))
    return {"answered": answered, "failed": len(failed), "failures": failed[:10]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--busy", type=int, default=8, help="clients keeping the server busy")
    parser.add_argument("--probes", type=int, default=48, help="clients idling about 5 s between two requests")
    parser.add_argument("--keepalive-expiry-s", type=float, default=5.0, help="the probes' keep-alive expiry (httpx's default: 5)")
    parser.add_argument("--server-keep-alive-s", type=float, default=None, help="clawrl serve --keep-alive-s (unset: its default)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clawrl-keepalive-") as scratch:
        model = build_tiny_model(Path(scratch) / "model", seed=0)
        run_dir, port = Path(scratch) / "run", free_port()
        root = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(model), "--device", "cpu", "--cpu-threads", "1",
                   "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", "m"]  # fmt: skip
        if args.server_keep_alive_s is not None:
            command += ["--keep-alive-s", str(args.server_keep_alive_s)]
        with (Path(scratch) / "serve.log").open("wb") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    httpx.get(root + "/healthz", timeout=5)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and server.poll() is None, "clawrl serve did not start"
                    time.sleep(0.5)
            result = asyncio.run(race(root, args.seconds, args.busy, args.probes, args.keepalive_expiry_s))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(90)
        with sqlite3.connect(run_dir / "clawrl.db") as db:
            result["turns_in_store"] = db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    print(result)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
