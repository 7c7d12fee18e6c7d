"""Serving latency while the trainer trains and new versions are swapped in, and how fast they arrive.

The server (the tiny model, rule judge; engine `--engine`: `hf` in this process, or `vllm`, vLLM's
server started from .venv-vllm) runs in this process; the trainer runs as a separate OS process, as
`clawrl serve --method combine` starts it. `--clients` clients send
requests back to back (distinct one-message prompts, `max_tokens` tokens, non-streaming) through
two phases of `--seconds` each:

1. **idle**: the trainer process is up but has nothing to train; a teaching client talks too, but
   its turns are side turns (never judged or trained on), so the request mix matches phase 2;
2. **training**: the teaching client runs sessions with a correction, thanks and a 👍 through
   `/v1/feedback`; the judge scores them, the trainer steps every `--batch-size` samples and
   publishes a version, and serving swaps it in while the clients keep going;
3. **after**: as phase 1, but serving the newest LoRA version: separates what decoding through
   an adapter costs from what the training itself costs the server.

Reported: p50/p99/mean latency and failed requests per phase, versions published and swapped,
and publish-to-served latency per version (store registration time to the first `/healthz` that
reports the version; polled every 10 ms), plus the server's own figure from `/metrics`.

    python benchmarks/swap_under_load.py --clients 16 --seconds 30
    python benchmarks/swap_under_load.py --clients 16 --seconds 30 --engine vllm

Prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from clawrl.config import BackgroundConfig, EngineConfig, JudgeConfig, ServeConfig, StoreConfig, TrainConfig
from clawrl.engines import build_engine
from clawrl.judge.worker import build_worker
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from clawrl.store.training import TrainingStore
from clawrl.trainer_process import TrainerProcess
from machine import machine  # benchmarks/machine.py, beside this script

SERVED_NAME = "bench"
CORRECTION = "this looks too AI-like, rewrite it without the bold and the numbered list"
# (name, whether the teaching client's sessions are trained on)
PHASES = (
    ("idle: base model, trainer up with nothing to train", False),
    ("training and swaps", True),
    ("after: newest LoRA version, trainer idle", False),
)


@dataclass
class Phase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    versions_seen: set[int] = field(default_factory=set)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        ms = sorted(latency * 1000 for latency in self.latencies_s)
        return {
            "phase": self.name,
            "requests": len(ms),
            "failed": len(self.failures),
            "failures": self.failures[:10],
            "p50_ms": statistics.median(ms),
            "p99_ms": percentile(ms, 0.99),
            "mean_ms": statistics.fmean(ms),
            "max_ms": ms[-1],
            "requests_per_s": len(ms) / self.wall_s,
            "versions_seen": sorted(self.versions_seen),
        }


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values: one that was really observed."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


async def load(base_url: str, clients: int, seconds: float, max_tokens: int, phase: Phase) -> None:
    """`clients` clients sending requests back to back for `seconds`."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async def client(index: int, http: httpx.AsyncClient) -> None:
        request = 0
        while time.monotonic() < deadline:
            request += 1
            body = {
                "model": SERVED_NAME,
                "messages": [{"role": "user", "content": f"Client {index} asks question number {request}: how are you?"}],
                "max_tokens": max_tokens,
            }
            started = time.perf_counter()
            try:
                response = await http.post("/chat/completions", json=body)
            except httpx.HTTPError as error:
                phase.failures.append(repr(error))
                continue
            if response.status_code != 200:
                phase.failures.append(f"{response.status_code}: {response.text[:200]}")
                continue
            phase.latencies_s.append(time.perf_counter() - started)
            phase.versions_seen.add(int(response.headers["x-clawrl-policy-version"]))

    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as http:
        await asyncio.gather(*(client(index, http) for index in range(clients)))
    phase.wall_s = time.monotonic() - started


class Teacher(threading.Thread):
    """One client having three-turn sessions; `trainable=False` sends them as side turns."""

    def __init__(self, base_url: str, trainable: bool) -> None:
        super().__init__(daemon=True)
        self.base_url, self.trainable, self.stop = base_url, trainable, threading.Event()
        self.sessions = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=300) as http:
            while not self.stop.is_set():
                session = f"teach-{self.trainable}-{self.sessions}"
                messages: list[dict[str, Any]] = []
                for line in [f"Write a short note to my team about Friday ({self.sessions}).", CORRECTION, "thanks, perfect"]:
                    messages.append({"role": "user", "content": line})
                    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": 16}
                    body["turn_type"] = "main" if self.trainable else "side"
                    response = http.post("/chat/completions", json=body, headers={"X-Session-Id": session})
                    messages.append(response.json()["choices"][0]["message"])
                if self.trainable:
                    http.post("/feedback", json={"session_id": session, "score": 1})
                self.sessions += 1


class VersionWatch(threading.Thread):
    """Polls /healthz every 10 ms and notes when each policy version is first served."""

    def __init__(self, root: str) -> None:
        super().__init__(daemon=True)
        self.root, self.stop, self.first_seen = root, threading.Event(), {}

    def run(self) -> None:
        with httpx.Client(base_url=self.root, timeout=30) as http:
            while not self.stop.is_set():
                version = http.get("/healthz").json()["policy_version"]
                self.first_seen.setdefault(version, time.time())
                time.sleep(0.01)


def publish_to_served(training: TrainingStore, watch: VersionWatch) -> list[dict[str, float]]:
    return [
        {"version": row.version, "seconds": watch.first_seen[row.version] - row.created_at}
        for row in training.versions()
        if row.version in watch.first_seen
    ]


def server_side_swap_mean(metrics_text: str) -> float | None:
    total = re.search(r"^clawrl_policy_publish_to_served_seconds_sum (\S+)$", metrics_text, re.MULTILINE)
    count = re.search(r"^clawrl_policy_publish_to_served_seconds_count (\S+)$", metrics_text, re.MULTILINE)
    if not total or not count or float(count.group(1)) == 0:
        return None
    return float(total.group(1)) / float(count.group(1))


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    model_dir = build_tiny_model(scratch / "model", seed=0) if args.model == "tiny" else Path(args.model)
    run_dir = scratch / "run"
    engine_config = EngineConfig(model=str(model_dir), engine=args.engine, device=args.device, cpu_threads=args.cpu_threads)
    store = Store.for_run_dir(run_dir)
    training = store.training
    engine = build_engine(engine_config)
    if args.engine != "hf":  # the server starts an hf engine itself; a vLLM server is started here, before the clock
        asyncio.run(engine.start())
    # the offline judge, whatever the model: it reads the teaching client's correction and thanks the same
    # way on every shape (a random-weight model judging itself would publish nothing)
    judge = build_worker(store, JudgeConfig(judge="rule", judge_poll_s=0.05), engine, engine_config)
    train_config = TrainConfig(method="combine", batch_size=args.batch_size, micro_batch_size=args.batch_size, train_poll_s=0.1)
    with ServerThread(engine, store, ServeConfig(port=free_port(), served_model_name=SERVED_NAME), judge) as server:
        root = server.base_url.removesuffix("/v1")
        background = BackgroundConfig(background_nice=args.background_nice, background_cpus=args.background_cpus)
        with TrainerProcess(engine_config, StoreConfig(run_dir=run_dir), train_config, background):
            time.sleep(args.trainer_start_s)  # let the trainer load before measuring "idle"
            asyncio.run(load(server.base_url, args.clients, 2.0, args.max_tokens, Phase("warm-up")))
            phases = []
            for name, trainable in PHASES:
                phase = Phase(name)
                teacher, watch = Teacher(server.base_url, trainable), VersionWatch(root)
                teacher.start()
                watch.start()
                published_before = training.newest_version()
                asyncio.run(load(server.base_url, args.clients, args.seconds, args.max_tokens, phase))
                teacher.stop.set()
                teacher.join()
                time.sleep(1.0)  # the last version published during the window reaches serving
                watch.stop.set()
                watch.join()
                summary = phase.summary()
                summary["versions_published"] = training.newest_version() - published_before
                summary["teaching_sessions"] = teacher.sessions
                phases.append(summary)
                if trainable:
                    arrivals = publish_to_served(training, watch)
            metrics_text = httpx.get(root + "/metrics").text
    store.close()
    seconds = [item["seconds"] for item in arrivals]
    return {
        "phases": phases,
        "publish_to_served": {
            "versions": len(seconds),
            "median_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None,
            "server_side_mean_s": server_side_swap_mean(metrics_text),
            "per_version": arrivals,
        },
    }


def markdown(results: dict[str, Any]) -> str:
    args = results["args"]
    lines = [
        f"engine {args['engine']}, {args['clients']} clients, {args['seconds']:.0f} s per phase, max_tokens={args['max_tokens']}, "
        f"trainer batch size {args['batch_size']}; load average at start {results['machine']['load_average_start']}, "
        f"at end {results['machine']['load_average_end']}:",
        "",
        "| phase | requests | failed | p50 (ms) | p99 (ms) | mean (ms) | requests/s | versions published |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in results["phases"]:
        lines.append(
            f"| {phase['phase']} | {phase['requests']} | {phase['failed']} | {phase['p50_ms']:.0f} | {phase['p99_ms']:.0f} | "
            f"{phase['mean_ms']:.0f} | {phase['requests_per_s']:.1f} | {phase['versions_published']} |"
        )
    swap = results["publish_to_served"]
    if swap["versions"]:
        lines += [
            "",
            f"Publish to served ({swap['versions']} versions): median {swap['median_s'] * 1000:.0f} ms, "
            f"max {swap['max_s'] * 1000:.0f} ms (client-observed via /healthz); server-side mean "
            f"{(swap['server_side_mean_s'] or 0) * 1000:.0f} ms.",
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients sending requests in a loop")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per load request")
    parser.add_argument("--batch-size", type=int, default=4, help="trainer batch size (a version every this many samples)")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally into a temp dir) or a Hugging Face model directory")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the serving engine")
    parser.add_argument("--device", default="cpu", help="engine and trainer device: cpu, cuda or auto")
    parser.add_argument("--cpu-threads", type=int, default=1, help="torch threads of the server and of the trainer")
    parser.add_argument("--background-nice", type=int, default=BackgroundConfig().background_nice,
                        help="the trainer's nice increment (0: the same priority as serving, as before issue 16)")
    parser.add_argument("--background-cpus", default=BackgroundConfig().background_cpus,
                        help="the trainer's CPUs: auto (the upper half), all (as before issue 16) or a list")
    parser.add_argument("--trainer-start-s", type=float, default=15.0, help="wait for the trainer process to load")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/swap_under_load.json"), help="JSON results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.cpu_threads)
    started = time.perf_counter()
    load_start = [round(value, 2) for value in os.getloadavg()]  # the machine may be shared
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as scratch:
        results = run(args, Path(scratch))
    results = {
        "benchmark": "swap_under_load",
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "machine": machine(load_average_start=load_start, load_average_end=[round(value, 2) for value in os.getloadavg()]),
        "elapsed_s": time.perf_counter() - started,
        **results,
    }
    print(markdown(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=list) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
