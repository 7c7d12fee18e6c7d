"""What the environments cost (issue 13, item 7): the sandbox's start, reset and per-command
overhead, and episodes and steps per minute of each family with the oracle policy.

- **Sandbox lifecycle**: `Sandbox.start`, `reset` and `close`, each timed `--repeats` times.
- **A command**: the same trivial command run on the host with `subprocess`, through
  `Sandbox.run` (a fork that enters the namespaces, rlimits, a pid namespace of its own) and
  through a persistent `ShellSession`: the difference is what the sandbox adds to a tool step.
- **Rollouts**: `clawrl rollout --policy oracle`'s own code path (`envs.rollout.play`, on the
  environment pool) per family at each `--concurrency`; the oracle never fails, so every figure is
  the environments' cost and none is the model's.
- **Footprint**: `--hold` environments of each family open at once, each in an episode with one
  oracle step taken (so its sandbox, shell or browser is up): the memory of every process they run
  (the proportional set size of this process's descendants, so shared libraries count once), per
  environment. With the rollouts' episodes per
  minute this says how many of a family one machine holds: memory bounds the count, the cores
  bound the throughput.

    python benchmarks/envs.py --repeats 30 --episodes 24 --concurrency 1,2,4

Prints markdown tables and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.protocol import Action
from clawrl.envs.registry import make_environment
from clawrl.envs.rollout import play_here
from clawrl.envs.sandbox import Sandbox, sandbox_available
from machine import machine  # benchmarks/machine.py, beside this script

# /usr/bin/python3 on both sides: the sandbox has the host's /usr, not a PATH of shims
COMMANDS = {"true": "true", "/usr/bin/python3 -c 'print(1)'": "/usr/bin/python3 -c 'print(1)'"}


def spread_ms(seconds: list[float]) -> dict[str, float]:
    """Median and p90 in milliseconds."""
    ordered = sorted(seconds)
    return {"median_ms": round(1000 * statistics.median(ordered), 2),
            "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2)}


async def timed(action: Callable[[], Awaitable[Any]], repeats: int) -> list[float]:
    durations = []
    for _ in range(repeats):
        started = time.perf_counter()
        await action()
        durations.append(time.perf_counter() - started)
    return durations


async def lifecycle(repeats: int) -> dict[str, dict[str, float]]:
    starts, resets, closes = [], [], []
    for _ in range(repeats):
        sandbox = Sandbox()
        started = time.perf_counter()
        await sandbox.start()
        starts.append(time.perf_counter() - started)
        resets += await timed(sandbox.reset, 1)
        closes += await timed(sandbox.close, 1)
    return {"start": spread_ms(starts), "reset": spread_ms(resets), "close": spread_ms(closes)}


def host_command(command: str) -> None:
    subprocess.run(["bash", "-c", command], check=True, capture_output=True)


async def command_costs(repeats: int) -> list[dict[str, Any]]:
    rows = []
    async with Sandbox() as sandbox:
        shell = await sandbox.shell()
        for name, command in COMMANDS.items():
            host = await timed(lambda: asyncio.to_thread(host_command, command), repeats)
            sandboxed = await timed(lambda: sandbox.run(command), repeats)
            in_shell = await timed(lambda: shell.run(command), repeats)
            rows.append({"command": name, "host": spread_ms(host), "sandbox_run": spread_ms(sandboxed),
                         "shell_session": spread_ms(in_shell)})
        await shell.close()
    return rows


async def rollouts(family: str, episodes: int, concurrency: int) -> dict[str, Any]:
    config = RolloutConfig(policy="oracle", episodes=episodes, concurrency=concurrency, split="train")
    summary = await play_here(EnvConfig(env=family), config,
                              lambda env, planned: make_policy("oracle", env, planned.task, planned.seed))
    steps = summary["mean_steps"] * (summary["episodes"] - summary["failed"])
    return {"family": family, "concurrency": concurrency, "episodes": summary["episodes"], "failed": summary["failed"],
            "mean_reward": summary["mean_reward"], "elapsed_s": summary["elapsed_s"],
            "episodes_per_min": summary["episodes_per_min"], "steps_per_min": round(60 * steps / summary["elapsed_s"], 1)}


def descendants(root: int) -> list[int]:
    """Every process below `root` (its children, theirs, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the parent is the 4th field, after the command name in parentheses (which may hold spaces)
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            parents.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def pss_mib(pids: list[int]) -> float:
    """Proportional set size of `pids` together (shared pages split among their users), in MiB."""
    total_kib = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total_kib += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total_kib / 1024


async def footprint(family: str, hold: int) -> dict[str, Any]:
    """Memory per open environment of `family`, `hold` of them in an episode at once."""
    env_config = EnvConfig(env=family)
    envs = [make_environment(env_config) for _ in range(hold)]
    tasks = await envs[0].tasks("train")
    try:
        for index, env in enumerate(envs):
            observation = await env.reset(index, tasks[index % len(tasks)])
            policy = await make_policy("oracle", env, tasks[index % len(tasks)], index)
            messages = [message.to_openai() for message in observation.messages]
            await env.step(Action.model_validate(await policy(messages, observation.tools)))
        await asyncio.sleep(1.0)  # let the processes settle
        taken = pss_mib(descendants(os.getpid()))  # the sandboxes and what runs in them are this process's
    finally:
        for env in envs:
            await env.close()
    return {"family": family, "held": hold, "mib_per_env": round(taken / hold, 1)}


def print_tables(results: dict[str, Any]) -> None:
    print("\n| sandbox | median (ms) | p90 (ms) |\n|---|---:|---:|")
    for name, figures in results["lifecycle"].items():
        print(f"| {name} | {figures['median_ms']} | {figures['p90_ms']} |")
    print("\n| command | host (ms) | Sandbox.run (ms) | ShellSession (ms) |\n|---|---:|---:|---:|")
    for row in results["commands"]:
        print(f"| `{row['command']}` | {row['host']['median_ms']} | {row['sandbox_run']['median_ms']} | "
              f"{row['shell_session']['median_ms']} |")
    print("\n| family | concurrency | episodes | failed | mean reward | episodes/min | steps/min |\n|---|---:|---:|---:|---:|---:|---:|")
    for row in results["rollouts"]:
        print(f"| {row['family']} | {row['concurrency']} | {row['episodes']} | {row['failed']} | {row['mean_reward']} | "
              f"{row['episodes_per_min']} | {row['steps_per_min']} |")
    print("\n| family | environments held | memory per environment (MiB) |\n|---|---:|---:|")
    for row in results["footprint"]:
        print(f"| {row['family']} | {row['held']} | {row['mib_per_env']} |")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(value) for value in args.concurrency.split(",")]
    return {
        "lifecycle": await lifecycle(args.repeats),
        "commands": await command_costs(args.repeats),
        "rollouts": [await rollouts(family, args.episodes, level)
                     for family in args.families.split(",") for level in levels],
        "footprint": [await footprint(family, args.hold) for family in args.families.split(",")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30, help="timings per sandbox operation and command")
    parser.add_argument("--episodes", type=int, default=24, help="oracle episodes per family and concurrency")
    parser.add_argument("--concurrency", default="1,2,4", help="episodes at a time, comma-separated")
    parser.add_argument("--families", default="toolcall,terminal,swe,web", help="environments, comma-separated")
    parser.add_argument("--hold", type=int, default=8, help="environments of a family held open at once for the footprint")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 repeats, 2 episodes, concurrency 1,2, 2 held")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/envs.json"))
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.episodes, args.concurrency, args.hold = 3, 2, "1,2", 2
    reason = sandbox_available()
    if reason is not None:
        raise SystemExit(f"sandboxes cannot start here: {reason}")
    results = asyncio.run(measure(args))
    print_tables(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()},
                                    **results}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
