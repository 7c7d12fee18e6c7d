"""What replicas and train workers cost and give: requests/s and latency with 1 and 2 replicas, in
this process or in Ray actors, the time from a published version to served on every replica, and
the trainer's step time with 1 and 2 data-parallel workers on Ray (`--train-workers`, ranks 1.. in
Ray actors).

Each arm starts a real server on the tiny model (`--replicas`, `--placement local|ray`); `--clients`
clients send requests back to back for `--seconds` (each a new one-message conversation, so the
router spreads them; `max_tokens` tokens, non-streamed); then a LoRA version is published through
the store as the trainer publishes one, and the time until every replica serves it is taken
(polled every 10 ms). On a machine whose cores the replicas share (this one: 2), two replicas give
no more throughput than one; the point is what the router and the actor hop cost, and that a
version reaches all.

The training part registers `--train-samples` judged samples (random prompts of about 200 tokens,
responses of about 40, rewards of both signs) in a fresh store and lets a real `Trainer` with
`--placement ray` take `--train-steps` steps of `--batch-size` with 1 worker, then with 2 (the
trainer's own LoRA, micro-batches of 2, one CPU thread a rank); the step time is each published
version's `step_seconds`, the median after the first step (which loads the model). Two ranks on two
shared cores cost rather than save, as the replicas do.

    python benchmarks/ray_placement.py --clients 8 --seconds 20

Prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import ray
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from clawrl.config import EngineConfig, ServeConfig, TrainConfig
from clawrl.engines import build_engine
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from clawrl.train.trainer import Trainer
from clawrl.types import Judgment, PolicyVersion, Sample, StepMetrics, Turn, TurnSampling
from clawrl.versions.files import Manifest, write_version
from machine import machine  # benchmarks/machine.py, beside this script

ARMS = (("local", 1), ("local", 2), ("ray", 1), ("ray", 2))


def adapter(model_dir: Path, out: Path) -> Path:
    """A rank-8 LoRA adapter with non-zero B, the size the trainer publishes."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    model.save_pretrained(out)
    return out


def publish(store: Store, run_dir: Path, weights: Path) -> float:
    """Register version 1 as the trainer does; returns when it was registered (time.monotonic)."""
    turn = Turn("bench-t", "bench-s", "main", "bench", 0, [{"role": "user", "content": "q"}], None, TurnSampling(), [1, 2], [3], [-0.5], "a", None, "stop")
    store.turns.record_turn(turn, "new", None, False)
    store.judging.record_judgment(Judgment("bench-t", 1, [1], 1.0, 0, None, None, [], "rule", "rule", 0.0))
    store.training.add_samples([Sample("bench-t", "ready", "rl", 1.0, 0)])
    manifest = Manifest(1, 0, 1, "lora", ["bench-t"], {})
    path, sha256 = write_version(run_dir, manifest, lambda d: [shutil.copy(p, d) for p in weights.iterdir()], lambda p: p.write_bytes(b"s"))
    store.training.register_version(PolicyVersion(1, 0, "lora", str(path), sha256, 1, StepMetrics()), ["bench-t"])
    return time.monotonic()


async def load(base_url: str, model: str, clients: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def client(number: int) -> None:
        nonlocal failures
        async with httpx.AsyncClient(timeout=120) as http:
            index = 0
            while time.monotonic() < deadline:
                body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": f"client {number} asks question {index}"}]}
                started = time.monotonic()
                response = await http.post(f"{base_url}/chat/completions", json=body)
                if response.status_code == 200:
                    latencies.append(time.monotonic() - started)
                else:
                    failures += 1
                index += 1

    begun = time.monotonic()
    await asyncio.gather(*(client(number) for number in range(clients)))
    elapsed = time.monotonic() - begun
    ordered = sorted(latencies)
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "failed": failures,
    }


def run_arm(model_dir: Path, weights: Path, placement: str, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"clawrl-bench-{placement}{replicas}-"))
    config = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1, placement=placement, replicas=replicas)
    engine = build_engine(config)
    store = Store.for_run_dir(run_dir)
    with ServerThread(engine, store, ServeConfig(port=free_port(), policy_poll_s=0.05)) as server:
        asyncio.run(load(server.base_url, engine.model_name, args.clients, 2.0, args.max_tokens))  # warm-up
        figures = asyncio.run(load(server.base_url, engine.model_name, args.clients, args.seconds, args.max_tokens))
        engines = engine.replicas if isinstance(engine, ReplicatedEngine) else [engine]
        registered = publish(store, run_dir, weights)
        while any(replica.policy_version != 1 for replica in engines):
            time.sleep(0.01)
        figures["publish_to_served_on_all_ms"] = 1000 * (time.monotonic() - registered)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"placement": placement, "replicas": replicas, **figures}


def register_samples(store: Store, count: int) -> None:
    """`count` judged main turns with one sample each, as the judge leaves them for the trainer."""
    generator = torch.Generator().manual_seed(0)
    for index in range(count):
        prompt = torch.randint(10, 2000, (200 + index % 7,), generator=generator).tolist()
        response = torch.randint(10, 2000, (40 + index % 5,), generator=generator).tolist()
        turn_id, reward = f"train-{index}", 1.0 if index % 2 else -1.0
        turn = Turn(turn_id, f"train-s{index}", "main", "bench", 0, [{"role": "user", "content": "q"}], None, TurnSampling(),
                    prompt, response, [-2.0] * len(response), "a", None, "stop")  # fmt: skip
        store.turns.record_turn(turn, "new", None, False)
        store.judging.record_judgment(Judgment(turn_id, int(reward), [int(reward)], 1.0, 0, None, None, [], "rule", "rule", 0.0))
        store.training.add_samples([Sample(turn_id, "ready", "rl", reward, 0)])


def train_arm(model_dir: Path, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Median step time of a Ray-placed trainer with `workers` data-parallel ranks."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"clawrl-bench-train{workers}-"))
    store = Store.for_run_dir(run_dir)
    register_samples(store, args.batch_size * args.train_steps)
    config = TrainConfig(method="rl", batch_size=args.batch_size, micro_batch_size=2, train_poll_s=0.05,
                         train_workers=workers, trainer_cpus=0.5)  # fmt: skip
    engine = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1, placement="ray")
    trainer = Trainer(config, engine, store, run_dir)
    trainer.start()
    try:
        steps = trainer.run(max_steps=args.train_steps)
    finally:
        trainer.close()
    seconds = [version.metrics.step_seconds for version in store.training.versions() if version.version > 0]
    store.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"train_workers": workers, "steps": steps, "step_s_median": statistics.median(seconds[1:] or seconds),
            "step_s_all": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("docs/results/ray-placement.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="clawrl-bench-models-"))
    model_dir = build_tiny_model(root / "model", seed=0)
    weights = adapter(model_dir, root / "adapter")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = [run_arm(model_dir, weights, placement, replicas, args) for placement, replicas in ARMS]
    training = [train_arm(model_dir, workers, args) for workers in (1, 2)]
    ray.shutdown()
    print("| placement | replicas | requests/s | p50 ms | p99 ms | failed | publish → served on all, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['placement']} | {row['replicas']} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
              f"{row['failed']} | {row['publish_to_served_on_all_ms']:.0f} |")
    print()
    print(f"| train workers (Ray) | steps of {args.batch_size} | step s, median after the first |")
    print("|---:|---:|---:|")
    for row in training:
        print(f"| {row['train_workers']} | {row['steps']} | {row['step_s_median']:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "machine": machine(), "clients": args.clients,
                                    "seconds": args.seconds, "max_tokens": args.max_tokens, "arms": rows,
                                    "batch_size": args.batch_size, "training": training}, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
