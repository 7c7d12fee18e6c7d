"""Does a tiny agent learn from its environment? Eval reward on a micro split through RL (DESIGN §9).

For each arm and seed: `clawrl serve` in a subprocess with the family's tiny agent
(`clawrl.sim.agents`), `--method rl` and the rule judge; then rounds of

    evaluate: every eval task of the micro split, K episodes each, played as side turns
              (never trained on), temperature 1, the same episode seeds in every round and arm of
              a seed, other ones for each seed (`eval_seed` = 777 + seed)
    train:    G rollouts of each of N train tasks through the server (recorded, judged, turned
              into GRPO samples by the trainer), then wait until the trainer has trained every
              full batch and serving answers with the newest version

and a last evaluation. Arms differ only in the step reward:

    integrated  r_t = outcome * gamma^(T-1-t) + 0.3 * judge_t   (--step-judge-coef 0.3)
    outcome     r_t = outcome * gamma^(T-1-t)                    (--step-judge-coef 0)

Intervals: a two-level bootstrap over seeds and eval episodes; arms of one seed are paired
episode by episode (same tasks, same seeds). Each seed plays its own eval episodes, so the seeds
are independent samples (before, all shared seed 777 and the bootstrap counted one baseline sample
three times). A difference's interval (`gain_ci`, the paired one) is the wider of that bootstrap and
a Student-t interval over the per-seed differences (`clawrl.sim.stats.paired_difference`). Trainer settings: the chat learning benchmark's for
`rl` (full fine-tuning, KL 0.3), batch 16, and the learning rate picked on tuning seed 100 among
1e-4, 2e-4 and 5e-4 (the report seeds are 10-12; the terminal family was not tuned at all).

    .venv/bin/python benchmarks/envs_learn.py --family toolcall --arms integrated,outcome --seeds 10-12 --out DIR
    .venv/bin/python benchmarks/envs_learn.py --quick --json      # one seed, two rounds: a smoke run

Prints a table, writes DIR/results.json (and each run's server log and store under DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clawrl.config import EnvConfig, RolloutConfig, parse_seeds
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.envs.registry import make_environment
from clawrl.envs.rollout import plan_episodes, run_rollouts
from clawrl.envs.server import server_policies
from clawrl.serve.runner import free_port
from clawrl.sim.agent_cache import agent_model_path
from clawrl.sim.agents import FAMILIES, micro_env_config
from clawrl.sim.bench import Agent, ServerProcess, settle
from clawrl.sim.metrics import bootstrap_ci, mean
from clawrl.sim.stats import paired_difference
from clawrl.store import Store
from clawrl.store.episodes import EpisodeStore

ARMS = {"integrated": 0.3, "outcome": 0.0}  # arm -> --step-judge-coef
# lr picked on tuning seed 100 (1e-4: eval 0.11 -> 0.36 in 6 rounds; 2e-4: -> 0.18; 5e-4: -> 0.03, the copying breaks)
TRAIN_FLAGS = {"full": True, "lr": 1e-4, "kl_beta": 0.3, "batch_size": 16, "episode_gamma": 0.9}
MAX_TOKENS = 96


def serve_command(model_dir: Path, run_dir: Path, port: int, judge_coef: float, seed: int, train_flags: dict[str, Any]) -> list[str]:
    flags = [f"--{name.replace('_', '-')}" + ("" if value is True else f"={value}") for name, value in train_flags.items()]
    return [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(model_dir), "--cpu-threads", "1",
            "--port", str(port), "--run-dir", str(run_dir), "--judge", "rule", "--method", "rl",
            f"--step-judge-coef={judge_coef}", f"--train-seed={seed}", *flags]  # fmt: skip


async def play(base_url: str, env: EnvConfig, split: str, planned: list[PlannedEpisode]) -> list[EpisodeRecord]:
    config = RolloutConfig(server=f"{base_url}/v1", split=split, temperature=1.0, max_tokens=MAX_TOKENS, concurrency=4,
                           episode_timeout_s=120.0)  # fmt: skip
    async with server_policies(config, env.env) as policies:
        return await run_rollouts(lambda: make_environment(env), policies, planned, config)


SHARED_EVAL_SEED = 777  # what every seed's evaluation played before issue 28 gave each seed its own


def eval_seed(seed: int) -> int:
    """The episode seed of a run's evaluations: the same in every round and arm of `seed`, other for each seed."""
    return SHARED_EVAL_SEED + seed


def eval_plan(env: EnvConfig, samples: int, seed: int) -> list[PlannedEpisode]:
    """Every eval task, `samples` times, with episode seeds fixed for every round and arm of `seed`."""
    tasks = asyncio.run(make_environment(env).tasks("eval"))
    config = RolloutConfig(policy="oracle", episodes=len(tasks) * samples, group_size=samples, seed=eval_seed(seed))
    return plan_episodes(tasks, config)


def wait_for_samples(episodes: EpisodeStore, timeout_s: float) -> None:
    """Until every episode group of the round has been judged and turned into samples by the trainer."""
    deadline = time.monotonic() + timeout_s
    while episodes.groups_to_sample(1) and time.monotonic() < deadline:
        time.sleep(0.5)


def outcomes(records: list[EpisodeRecord]) -> list[float]:
    """Per planned episode, its reward; a failed episode counts 0 (a policy that breaks scores nothing)."""
    return [0.0 if record.failed else record.reward for record in records]


def run_arm(arm: str, seed: int, family: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    env = micro_env_config(family)
    model_dir = agent_model_path(env.cache_dir, family)
    run_dir = out / f"{family}-{arm}-seed{seed}"
    evaluation = eval_plan(env, args.eval_samples, seed)
    train_tasks = asyncio.run(make_environment(env).tasks("train"))
    port = free_port()
    curve: list[dict[str, Any]] = []
    with ServerProcess(serve_command(model_dir, run_dir, port, ARMS[arm], seed, args.train_flags), run_dir, port) as server:
        agent = Agent(server.base_url, "unused", MAX_TOKENS)
        store = Store.for_run_dir(run_dir)
        training, episodes = store.training, store.episodes
        for round_number in range(args.rounds + 1):
            started = time.monotonic()
            version = agent.policy_version()
            scores = outcomes(asyncio.run(play(server.base_url, env, "eval", evaluation)))
            curve.append({"round": round_number, "version": version, "eval_reward": mean(scores), "outcomes": scores})
            print(f"{family} {arm} seed {seed} round {round_number}: eval reward {mean(scores):.3f} on version {version} "
                  f"({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)  # fmt: skip
            if round_number == args.rounds:
                break
            plan_config = RolloutConfig(policy="oracle", episodes=args.groups * args.group_size, group_size=args.group_size,
                                        seed=seed * 100_000 + round_number * 1000)  # fmt: skip
            records = asyncio.run(play(server.base_url, env, "train", plan_episodes(train_tasks, plan_config)))
            curve[-1]["train_reward"] = mean(outcomes(records))
            wait_for_samples(episodes, timeout_s=300)
            settle(agent, training, args.train_flags["batch_size"], timeout_s=600)
        agent.close()
    return {"arm": arm, "seed": seed, "family": family, "eval_seed": eval_seed(seed), "curve": curve}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and round, the mean eval reward with a bootstrap interval; final paired differences."""
    summary: dict[str, Any] = {"arms": {}, "paired": {}}
    by_arm: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], {})[run["seed"]] = run["curve"]
    for arm, curves in by_arm.items():
        rounds = min(len(curve) for curve in curves.values())
        points = []
        for round_number in range(rounds):
            groups = [curve[round_number]["outcomes"] for curve in curves.values()]
            low, high = bootstrap_ci(groups)
            points.append({"round": round_number, "eval_reward": mean([mean(g) for g in groups]), "ci": [low, high]})
        first = {seed: curve[0]["outcomes"] for seed, curve in curves.items()}
        last = {seed: curve[rounds - 1]["outcomes"] for seed, curve in curves.items()}
        gain = paired_difference(last, first)
        summary["arms"][arm] = {"seeds": sorted(curves), "curve": points, "gain": gain, "gain_ci": gain["ci"] if gain else None}
    if {"integrated", "outcome"} <= set(by_arm):
        finals = {arm: {seed: curve[-1]["outcomes"] for seed, curve in by_arm[arm].items()} for arm in ("integrated", "outcome")}
        summary["paired"]["integrated-outcome"] = paired_difference(finals["integrated"], finals["outcome"])
    return summary


def resummarize(path: Path) -> dict[str, Any]:
    """A results.json summarized again with today's intervals (`gain_ci` the wider of the bootstrap and a t-interval).

    The summary it was reported with stays (`summary`: the docs quote it); today's goes beside it
    (`summary_now`). Runs from before each seed had its own eval episodes lack `eval_seed`: every
    one of them played SHARED_EVAL_SEED, so the file says so (`eval_seed` on each run,
    `eval_episodes_shared`); the bootstrap then counts one set of episodes once per seed, and only
    the t-interval over seeds widens it.
    """
    results = json.loads(path.read_text())
    shared = any("eval_seed" not in run for run in results["runs"])
    for run in results["runs"]:
        run.setdefault("eval_seed", SHARED_EVAL_SEED)
    results["eval_episodes_shared"] = shared or results.get("eval_episodes_shared", False)
    results["summary_now"] = summarize(results["runs"])
    path.write_text(json.dumps(results, indent=1))
    return results["summary_now"]


def table(summary: dict[str, Any]) -> str:
    lines = ["arm          round  eval reward  95% interval"]
    for arm, data in summary["arms"].items():
        for point in data["curve"]:
            low, high = point["ci"]
            lines.append(f"{arm:<12} {point['round']:>5}  {point['eval_reward']:>11.3f}  [{low:.3f}, {high:.3f}]")
        gain = data["gain"]
        if gain:
            lines.append(f"{arm:<12} gain   {gain['mean']:>+11.3f}  [{gain['ci'][0]:+.3f}, {gain['ci'][1]:+.3f}] (last - first, paired)")
    for name, difference in summary["paired"].items():
        if difference:
            lines.append(f"{name}: {difference['mean']:+.3f} [{difference['ci'][0]:+.3f}, {difference['ci'][1]:+.3f}] (final, paired)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="toolcall")
    parser.add_argument("--arms", default="integrated", help="comma-separated: integrated, outcome")
    parser.add_argument("--seeds", default="10-12")
    parser.add_argument("--rounds", type=int, default=6, help="training rounds (an evaluation before each and after the last)")
    parser.add_argument("--groups", type=int, default=16, help="train tasks per round")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per train task (GRPO group)")
    parser.add_argument("--eval-samples", type=int, default=2, help="episodes per eval task in each evaluation")
    parser.add_argument("--out", type=Path, default=None, help="directory for results.json and the runs (default: a temp dir)")
    parser.add_argument("--lr", type=float, default=TRAIN_FLAGS["lr"], help="trainer learning rate (tune on other seeds)")
    parser.add_argument("--kl-beta", type=float, default=TRAIN_FLAGS["kl_beta"], help="KL anchor to the starting weights")
    parser.add_argument("--quick", action="store_true", help="one seed, one round, small groups: a smoke run")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    parser.add_argument("--resummarize", type=Path, metavar="RESULTS_JSON",
                        help="run nothing: add to a results.json its summary with today's intervals (`summary_now`)")
    args = parser.parse_args()
    if args.resummarize:
        print(table(resummarize(args.resummarize)))
        return
    if args.quick:
        args.seeds, args.rounds, args.groups, args.group_size, args.eval_samples = "0", 1, 4, 4, 1
    args.train_flags = TRAIN_FLAGS | {"lr": args.lr, "kl_beta": args.kl_beta}
    out = args.out or Path(tempfile.mkdtemp(prefix="clawrl-envs-learn-"))
    out.mkdir(parents=True, exist_ok=True)
    arms = [arm.strip() for arm in args.arms.split(",")]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; arms are {', '.join(ARMS)}")
    command = " ".join(["benchmarks/envs_learn.py", *sys.argv[1:]])
    runs: list[dict[str, Any]] = []
    for seed in parse_seeds(args.seeds):
        for arm in arms:
            runs.append(run_arm(arm, seed, args.family, args, out))
            summary = summarize(runs)  # written after every run: an interrupted benchmark keeps what it measured
            (out / "results.json").write_text(json.dumps({"command": command, "train_flags": args.train_flags,
                                                          "summary": summary, "runs": runs}, indent=1))  # fmt: skip
    print(json.dumps(summary) if args.json else table(summary))


if __name__ == "__main__":
    main()
