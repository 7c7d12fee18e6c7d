"""Many users' adapters served by one engine at once (issue 32, item 3).

Three measurements on the tiny model, every engine called through its own API in this process
(`engine.generate(ids, sampling, lineage)`), as `clawrl serve --adapters per-user` calls it:

1. **Throughput and latency by distinct adapters.** 32 clients send distinct prompts back to back
   (greedy, `--max-tokens`); client i asks as lineage i mod k, for k = 1, 8 and 32 distinct LoRA
   adapters (rank `--rank`, every linear layer, random non-zero B so that each changes the answer).
   Generated tokens/s over the wall time, p50/p99 of the request latency, and each k's throughput
   as a ratio of k = 1. On `hf` the rows of all k adapters decode in one batch (the stacked
   adapters of `engines/hf_grouped_lora.py`); on `vllm` each request names its adapter and vLLM
   batches them.
2. **Cold adapter load**: `load_version` of an adapter the engine has never seen, into a new
   lineage, to its first token served (`--cold-loads` of them).
3. **A thousand users** through the whole server (`hf` only): `--users` registered users, each
   with a published LoRA version of their own on disk and in the store, a real `clawrl` server
   (`--adapters per-user`, `--max-loaded-adapters`), and `--user-requests` chat requests over HTTP from 8
   clients, each with a random user's key; reported: failures, the adapters held at most, and the
   latency of requests that loaded their user's adapter against those that found it loaded.

The machine may be shared: each k runs on every engine in turn (A B, then B A) and
`os.getloadavg()` is recorded around each section.

    python benchmarks/multi_adapter.py            # about 10 minutes on 2 cores
    python benchmarks/multi_adapter.py --quick    # fewer requests and users (about 4 minutes)

Prints markdown tables and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
from machine import machine  # benchmarks/machine.py, beside this script
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from clawrl.config import EngineConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, SamplingParams
from clawrl.model.chat import render_prompt
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from clawrl.types import PolicyVersion, StepMetrics
from clawrl.versions.files import Manifest, write_version

CLIENTS = 32
DISTINCT_ADAPTERS = (1, 8, 32)
USER_CLIENTS = 8


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values: one that was really observed."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# --------------------------------------------------------------------------- adapters on disk


class AdapterMaker:
    """Random LoRA adapters for one model: the PEFT model is built once, its B matrices redrawn per adapter."""

    def __init__(self, model_dir: Path, rank: int) -> None:
        base = AutoModelForCausalLM.from_pretrained(model_dir)
        self.model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))

    def save(self, out: Path, seed: int) -> Path:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
        self.model.save_pretrained(out)
        return out


def lineage(index: int) -> str:
    return f"user{index:04d}"


# --------------------------------------------------------------------------- 1. throughput by adapters


async def timed_generation(engine: Engine, ids: list[int], max_tokens: int, lineage_name: str) -> tuple[float, int]:
    started = time.perf_counter()
    tokens = 0
    async for _step in engine.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens), lineage_name):
        tokens += 1
    return time.perf_counter() - started, tokens


async def throughput_run(engine: Engine, distinct: int, requests: int, max_tokens: int, offset: int) -> dict[str, Any]:
    latencies: list[float] = []
    tokens = 0
    next_index = iter(range(requests))

    async def client(number: int) -> None:
        nonlocal tokens
        for index in next_index:
            text = f"Client question number {offset + index}: how are you today, and what is new?"
            ids = render_prompt(engine.tokenizer, [{"role": "user", "content": text}], None)
            latency, generated = await timed_generation(engine, ids, max_tokens, lineage(number % distinct))
            latencies.append(latency)
            tokens += generated

    started = time.perf_counter()
    await asyncio.gather(*(client(number) for number in range(CLIENTS)))
    return {"wall_s": time.perf_counter() - started, "latencies_s": latencies, "tokens": tokens}


async def throughput(engines: dict[str, Engine], args: argparse.Namespace) -> list[dict[str, Any]]:
    # Unmeasured first: every adapter through every engine once (vLLM's first batches of a shape and
    # its first use of each LoRA slot are slow; measured, they made one adapter look slower than 32).
    for engine in engines.values():
        await throughput_run(engine, max(DISTINCT_ADAPTERS), CLIENTS, args.max_tokens, -100_000)
    levels = []
    for distinct in DISTINCT_ADAPTERS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
        load_before = load_average()
        order = list(engines) + list(reversed(engines))
        for turn, name in enumerate(order):
            runs[name].append(await throughput_run(engines[name], distinct, args.requests // 2, args.max_tokens, turn * 10_000))
        for name, parts in runs.items():
            ms = sorted(latency * 1000 for part in parts for latency in part["latencies_s"])
            tokens, wall = sum(part["tokens"] for part in parts), sum(part["wall_s"] for part in parts)
            levels.append({
                "engine": name, "distinct_adapters": distinct, "clients": CLIENTS, "requests": len(ms), "tokens": tokens,
                "wall_s": wall, "tokens_per_s": tokens / wall, "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
                "load_average_before": load_before, "load_average_after": load_average(),
            })  # fmt: skip
    for level in levels:
        single = next(row for row in levels if row["engine"] == level["engine"] and row["distinct_adapters"] == 1)
        level["ratio_to_one_adapter"] = level["tokens_per_s"] / single["tokens_per_s"]
    return levels


async def load_adapters(engine: Engine, paths: list[Path], first_version: int) -> None:
    for index, path in enumerate(paths):
        await engine.load_version(first_version + index, path, lineage(index))


# --------------------------------------------------------------------------- 2. cold loads


async def cold_loads(engine: Engine, paths: list[Path], first_version: int) -> list[float]:
    """Seconds from `load_version` of a new adapter to its first token."""
    ids = render_prompt(engine.tokenizer, [{"role": "user", "content": "hello"}], None)
    seconds = []
    for index, path in enumerate(paths):
        name = f"cold{index}"
        started = time.perf_counter()
        await engine.load_version(first_version + index, path, name)
        async for _step in engine.generate(ids, SamplingParams(temperature=0, max_tokens=1), name):
            break
        seconds.append(time.perf_counter() - started)
    return seconds


# --------------------------------------------------------------------------- 3. a thousand users


def publish_user_versions(store: Store, run_dir: Path, maker: AdapterMaker, users: int) -> dict[str, str]:
    """`users` users, each with one published LoRA version of their own; returns their keys."""
    keys = {}
    for index in range(users):
        name = lineage(index)
        keys[name] = store.users.add(name)[1]
        number = store.training.next_version_number()
        manifest = Manifest(number, 0, 1, "lora", [], {}, lineage=name)
        path, sha256 = write_version(run_dir, manifest, lambda directory, index=index: maker.save(directory, index),
                                     lambda state: torch.save({}, state))  # fmt: skip
        store.training.register_version(PolicyVersion(number, 0, "lora", str(path), sha256, 1, StepMetrics(), lineage=name), [])
    return keys


def many_users(model_dir: Path, scratch: Path, maker: AdapterMaker, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = scratch / "users-run"
    store = Store.for_run_dir(run_dir)
    published = time.perf_counter()
    keys = publish_user_versions(store, run_dir, maker, args.users)
    publish_s = time.perf_counter() - published
    engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1,
                                       max_loaded_adapters=args.max_loaded_adapters))  # fmt: skip
    chooser = random.Random(0)
    picks = [chooser.choice(sorted(keys)) for _ in range(args.user_requests)]
    held_most, outcomes = 0, []
    config = ServeConfig(port=free_port(), api_key="admin", policy_poll_s=1.0)
    with ServerThread(engine, store, config, adapters="per-user") as server, ThreadPoolExecutor(USER_CLIENTS + 1) as pool:
        stop = False

        def watch() -> None:
            nonlocal held_most
            while not stop:
                held_most = max(held_most, len([version for version in engine.held_versions() if version != 0]))
                time.sleep(0.005)

        watcher = pool.submit(watch)
        with httpx.Client(base_url=server.base_url, timeout=120) as http:

            def ask(user: str) -> dict[str, Any]:
                loaded_before = engine.lineage_version(user) is not None
                body = {"model": engine.model_name, "messages": [{"role": "user", "content": f"hi, I am {user}"}],
                        "max_tokens": args.max_tokens, "temperature": 0, "turn_type": "side"}  # fmt: skip
                started = time.perf_counter()
                response = http.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {keys[user]}"})
                return {"user": user, "status": response.status_code, "seconds": time.perf_counter() - started,
                        "lineage": response.headers.get("x-clawrl-policy-lineage"), "loaded_before": loaded_before}  # fmt: skip

            started = time.perf_counter()
            outcomes = list(pool.map(ask, picks))
            wall = time.perf_counter() - started
        stop = True
        watcher.result()
    failures = [row for row in outcomes if row["status"] != 200 or row["lineage"] != row["user"]]
    bound = args.max_loaded_adapters + USER_CLIENTS  # the limit is on idle adapters: those in use come on top
    cold = sorted(row["seconds"] * 1000 for row in outcomes if not row["loaded_before"])
    warm = sorted(row["seconds"] * 1000 for row in outcomes if row["loaded_before"])
    return {
        "users": args.users, "requests": len(outcomes), "clients": USER_CLIENTS, "max_loaded_adapters": args.max_loaded_adapters,
        "failures": len(failures), "failure_examples": failures[:3], "held_at_most": held_most, "wall_s": wall,
        "held_bound": bound, "within_bound": held_most <= bound,
        "publish_all_s": publish_s, "requests_that_loaded": len(cold),
        "p50_ms_loading": statistics.median(cold) if cold else None, "p50_ms_loaded": statistics.median(warm) if warm else None,
    }  # fmt: skip


# --------------------------------------------------------------------------- the run


async def engine_sections(model_dir: Path, scratch: Path, maker: AdapterMaker, args: argparse.Namespace) -> dict[str, Any]:
    paths = [maker.save(scratch / "adapters" / f"a{index}", 10_000 + index) for index in range(max(DISTINCT_ADAPTERS))]
    cold_paths = [maker.save(scratch / "adapters" / f"cold{index}", 20_000 + index) for index in range(args.cold_loads)]
    common = {"model": str(model_dir), "device": "cpu", "cpu_threads": args.cpu_threads, "max_batch_size": CLIENTS,
              "max_loaded_adapters": max(DISTINCT_ADAPTERS) + args.cold_loads, "max_lora_rank": args.rank,
              "max_loras": max(DISTINCT_ADAPTERS)}  # fmt: skip
    kinds = ["hf", "vllm"] if not args.hf_only else ["hf"]
    engines = {kind: build_engine(EngineConfig(engine=kind, **common)) for kind in kinds}
    try:
        for engine in engines.values():
            await engine.start()
            await load_adapters(engine, paths, first_version=1)
        levels = await throughput(engines, args)
        cold = {name: await cold_loads(engine, cold_paths, first_version=1000) for name, engine in engines.items()}
    finally:
        for engine in engines.values():
            await engine.close()
    return {"throughput": levels, "cold_load_s": cold}


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    torch.set_num_threads(args.cpu_threads)
    model_dir = build_tiny_model(scratch / "tiny", seed=0)
    maker = AdapterMaker(model_dir, args.rank)
    results: dict[str, Any] = {"machine": machine(), "rank": args.rank, "max_tokens": args.max_tokens,
                               "command": " ".join(["python", "benchmarks/multi_adapter.py", *sys.argv[1:]])}  # fmt: skip
    results |= asyncio.run(engine_sections(model_dir, scratch, maker, args))
    results["many_users"] = many_users(model_dir, scratch, maker, args)
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Rank-{results['rank']} LoRA on every linear layer of the tiny model, {CLIENTS} clients, "
             f"{results['max_tokens']} tokens per answer.", "",
             "| engine | distinct adapters | tokens/s | ratio to 1 | p50 ms | p99 ms |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in results["throughput"]:
        lines.append(f"| {row['engine']} | {row['distinct_adapters']} | {row['tokens_per_s']:.0f} | "
                     f"{row['ratio_to_one_adapter']:.2f} | {row['p50_ms']:.0f} | {row['p99_ms']:.0f} |")  # fmt: skip
    lines += ["", "| engine | cold adapter load to first token, median ms | max ms |", "|---|---|---|"]
    for name, seconds in results["cold_load_s"].items():
        lines.append(f"| {name} | {statistics.median(seconds) * 1000:.0f} | {max(seconds) * 1000:.0f} |")
    users = results["many_users"]
    lines += ["", "| users | requests | failures | adapters held at most (idle limit + clients) | requests that loaded | p50 ms loading | p50 ms loaded |",
              "|---|---|---|---|---|---|---|",
              f"| {users['users']} | {users['requests']} | {users['failures']} | {users['held_at_most']} "
              f"({users['max_loaded_adapters']} + {users['clients']}) | {users['requests_that_loaded']} | {_ms(users['p50_ms_loading'])} | "
              f"{_ms(users['p50_ms_loaded'])} |"]  # fmt: skip
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and users")
    parser.add_argument("--requests", type=int, default=128, help="requests per engine and number of adapters")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--cold-loads", type=int, default=5)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--user-requests", type=int, default=200)
    parser.add_argument("--max-loaded-adapters", type=int, default=8)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--hf-only", action="store_true", help="skip vLLM (no .venv-vllm)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/multi-adapter.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.users, args.user_requests, args.cold_loads = 64, 200, 100, 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clawrl-multi-adapter-") as scratch:
        results = run(args, Path(scratch))
    print(markdown(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
