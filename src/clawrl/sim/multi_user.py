"""`clawrl bench learn --users student,teacher,terse`: several people on one server, one policy or one each.

Several simulated users, each with a key of their own (`clawrl users add`), take turns on one
`clawrl serve --method combine`: round after round, every user plays one session (the same
problems and request seeds their single-user benchmark would give them, `bench.workload`), and
waits, as a person pausing between conversations would, until training has caught up with it.
Before the first round and after the last, every user's held-out prompts are answered with their
own key and scored by their own preference.

Arms:

* ``none``: serve and judge, no training (the control);
* ``shared``: one policy trained on everyone's judged turns (`--adapters shared`, today's default);
* ``per_user``: each user's turns train their own LoRA lineage from the base (`--adapters per-user`),
  and each user is answered by theirs.

Both trained arms train LoRA with the same settings (`MULTI_USER_TRAIN_DEFAULTS`): per-user
lineages are adapters beside one base, so `--full` (the single-user benchmark's pick) is not
available to them, and the shared arm uses the same adapter so that the arms differ only in whose
turns train what. The question is whether users who want opposite things (the student: every
step; the teacher: long and warm; the terse user: one sentence) each get what they want from a
lineage of their own, where one shared policy is pulled between them.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clawrl.config import BenchConfig
from clawrl.serve.runner import free_port
from clawrl.sim.bench import (
    Agent, ServerProcess, catch_up, evaluate, model_build, play_session, prepared_model, request_seed, serve_command,
    workload,
)
from clawrl.sim.chats import hint_strings_shared_with_pretraining
from clawrl.sim.metrics import bootstrap_ci, mean, t_interval, wider
from clawrl.sim.personas import PERSONAS
from clawrl.sim.report import command_line, flags_for
from clawrl.sim.results import Evaluation
from clawrl.sim.stats import paired_difference
from clawrl.sim.users import ScriptedVoice, UserSession
from clawrl.store import Store

MULTI_USER_ARMS = ("none", "shared", "per_user")
ADAPTERS = {"shared": "shared", "per_user": "per-user"}  # `--adapters` of each trained arm
# One LoRA setting for both trained arms, chosen before any multi-user run and not tuned on one:
# the single-user pick's batch, KL anchor and reward baseline, with a learning rate ten times its
# full fine-tuning one (a LoRA adapter's usual ratio).
MULTI_USER_TRAIN_DEFAULTS: dict[str, Any] = {"full": False, "lr": 1e-3, "batch_size": 4, "kl_beta": 0.3,
                                             "reward_baseline_samples": 32}
PAIRS = (("per_user", "shared"), ("per_user", "none"), ("shared", "none"))
PROBE_MAX_TOKENS = 1


class UserAgent(Agent):
    """The benchmark's client for one user: their key on every request, and the version that answers
    them (their lineage's) read from a one-token side turn, since /healthz reports the shared one."""

    def __init__(self, base_url: str, key: str, config: BenchConfig) -> None:
        super().__init__(base_url, config.model, config.max_tokens, config.temperature, config.top_p)
        self.client.headers["Authorization"] = f"Bearer {key}"

    def policy_version(self) -> int:
        probe = [{"role": "user", "content": "version?"}]
        return self.complete(probe, seed=0, side=True, max_tokens=PROBE_MAX_TOKENS).version


@dataclass
class UserRun:
    """One user in one arm under one seed."""

    user: str
    baseline: Evaluation | None = None
    final: Evaluation | None = None
    session_satisfied: list[bool] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "baseline": _evaluation_json(self.baseline), "final": _evaluation_json(self.final),
                "session_satisfied": self.session_satisfied}


def _evaluation_json(evaluation: Evaluation | None) -> dict[str, Any] | None:
    return None if evaluation is None else {**asdict(evaluation), "score": evaluation.score}


@dataclass(frozen=True)
class RoundDone:
    """Progress: every user has played one more session."""

    arm: str
    seed: int
    session: int
    sessions: int
    versions: dict[str, int]

    def __str__(self) -> str:
        served = ", ".join(f"{user} v{version}" for user, version in self.versions.items())
        return f"[{self.arm} seed {self.seed}] round {self.session}/{self.sessions}: {served}"


def run_multi_user_arm(arm: str, seed: int, users: Sequence[str], config: BenchConfig, train_flags: dict[str, Any],
                       progress: Callable[[RoundDone], None] = print) -> list[UserRun]:
    """One server for `arm`; every user's sessions interleaved round by round; each user evaluated
    with their own key before the first round and after the last."""
    run_dir = config.out / "runs" / f"{arm}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    store = Store.for_run_dir(run_dir)
    keys = {user: store.users.add(user)[1] for user in users}
    port = free_port()
    # the untrained arm's command line, then the trained arms' flags: an admin key, so that every
    # request the users make is theirs by their own key
    command = serve_command("none", config, {}, run_dir, port) + ["--api-key", secrets.token_urlsafe()]
    if arm in ADAPTERS:
        command += ["--method", "combine", *flags_for({**train_flags, "adapters": ADAPTERS[arm]})]
    works = {user: workload(config, PERSONAS[user], seed) for user in users}
    results = {user: UserRun(user) for user in users}
    with ServerProcess(command, run_dir, port) as server:
        agents = {user: UserAgent(server.base_url, keys[user], config) for user in users}
        try:
            for user in users:
                results[user].baseline = evaluate(agents[user], PERSONAS[user], works[user], 0)
            for index in range(1, config.sessions + 1):
                for user in users:
                    session = UserSession(PERSONAS[user], works[user].sessions[index - 1],
                                          random.Random(f"user-{user}-{seed}-{index}"), ScriptedVoice(),
                                          **config.user_noise())
                    continued = play_session(agents[user], session, request_seed(seed, user, "session", index))
                    results[user].session_satisfied.append(session.satisfied)
                    if arm == "per_user":  # the user's own samples train the user's own lineage
                        catch_up(agents[user], store, continued, train_flags["batch_size"], config.settle_s,
                                 user=user, lineage=user)
                    elif arm == "shared":
                        catch_up(agents[user], store, continued, train_flags["batch_size"], config.settle_s)
                progress(RoundDone(arm, seed, index, config.sessions,
                                   {user: agents[user].policy_version() for user in users}))
            for user in users:
                results[user].final = evaluate(agents[user], PERSONAS[user], works[user], config.sessions)
        finally:
            for agent in agents.values():
                agent.close()
            store.close()
    return [results[user] for user in users]


def summarize(runs: dict[str, dict[int, list[UserRun]]], users: Sequence[str]) -> dict[str, Any]:
    """Per arm and user: the baseline and final held-out scores over seeds, the final's interval, and
    the paired final − baseline; per user, the paired differences between arms' finals."""
    arms: dict[str, Any] = {}
    finals: dict[str, dict[str, dict[int, list[bool]]]] = {user: {} for user in users}
    for arm, by_seed in runs.items():
        arms[arm] = {}
        for user in users:
            of_user = {seed: next(run for run in seed_runs if run.user == user) for seed, seed_runs in by_seed.items()}
            final = {seed: run.final for seed, run in of_user.items() if run.final}
            baseline = {seed: run.baseline for seed, run in of_user.items() if run.baseline}
            finals[user][arm] = {seed: evaluation.outcomes for seed, evaluation in final.items()}
            per_seed = [evaluation.score for evaluation in final.values()]
            arms[arm][user] = {
                "baseline": mean([evaluation.score for evaluation in baseline.values()]),
                "final": mean(per_seed),
                "ci": list(wider(bootstrap_ci(list(finals[user][arm].values())), t_interval(per_seed))),
                "paired": paired_difference(finals[user][arm],
                                            {seed: evaluation.outcomes for seed, evaluation in baseline.items()}),
                "final_per_seed": {str(seed): evaluation.score for seed, evaluation in final.items()},
                "correct_final": _mean_or_none([share for evaluation in final.values()
                                                if (share := evaluation.correct_share) is not None]),
                "sessions_satisfied": mean([mean(run.session_satisfied) for run in of_user.values()]),
                "versions_final": {str(seed): run.final.version for seed, run in of_user.items() if run.final},
            }
    paired = {user: {f"{a}-{b}": paired_difference(finals[user][a], finals[user][b])
                     for a, b in PAIRS if a in finals[user] and b in finals[user]} for user in users}
    return {"arms": arms, "paired": paired}


def _mean_or_none(values: list[float]) -> float | None:
    return mean(values) if values else None


def run_multi_user_bench(config: BenchConfig, users: Sequence[str], given_train_flags: dict[str, Any],
                         progress: Callable[[RoundDone], None] = print) -> dict[str, Any]:
    """Every arm under every seed; writes results.json (and --summary) to `config.out`."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    model_dir = prepared_model(config)
    train_flags = {**MULTI_USER_TRAIN_DEFAULTS, **given_train_flags}
    config.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[int, list[UserRun]]] = {}
    seconds: dict[str, float] = {}
    for arm in config.user_arms:
        started = time.perf_counter()
        runs[arm] = {seed: run_multi_user_arm(arm, seed, users, config, train_flags, progress)
                     for seed in config.run_seeds()}
        seconds[arm] = round(time.perf_counter() - started, 1)
        (config.out / "runs.json").write_text(json.dumps(
            {a: {str(s): [r.to_json() for r in rs] for s, rs in by_seed.items()} for a, by_seed in runs.items()}))
    results = {
        "users": list(users), "sessions_per_user": config.sessions, "seeds": config.run_seeds(),
        "heldout_prompts": config.heldout_prompts, "model": config.model, "model_build": model_build(Path(model_dir)),
        "pretrain_styles": config.pretrain_styles,
        "hint_strings_shared_with_pretraining": hint_strings_shared_with_pretraining(),
        "train_flags": " ".join(flags_for(train_flags)), "seconds": seconds,
        "command": _command_line(config, users),
        **summarize(runs, users),
    }
    text = json.dumps(results, indent=1)
    (config.out / "results.json").write_text(text)
    if config.summary:
        config.summary.parent.mkdir(parents=True, exist_ok=True)
        config.summary.write_text(text)
    return results


def _command_line(config: BenchConfig, users: Sequence[str]) -> str:
    arms = "" if tuple(config.user_arms) == MULTI_USER_ARMS else f" --user-arms {','.join(config.user_arms)}"
    return command_line(config).replace(f"--method {config.method}", f"--users {','.join(users)}{arms}")


def multi_user_table(results: dict[str, Any]) -> str:
    """Markdown: per user and arm, baseline → final with the final's interval; then the paired differences."""
    lines = ["| user | arm | baseline | final (95% CI) |", "|---|---|---|---|"]
    for user in results["users"]:
        for arm, by_user in results["arms"].items():
            row = by_user[user]
            lines.append(f"| {user} | {arm} | {row['baseline']:.2f} | {row['final']:.2f} "
                         f"[{row['ci'][0]:.2f}, {row['ci'][1]:.2f}] |")
    lines += ["", "| user | difference of finals | mean (95% CI) |", "|---|---|---|"]
    for user, pairs in results["paired"].items():
        for name, difference in pairs.items():
            if difference:
                lines.append(f"| {user} | {name} | {difference['mean']:+.2f} "
                             f"[{difference['ci'][0]:+.2f}, {difference['ci'][1]:+.2f}] |")
    return "\n".join(lines)


def check_arms(arms: Sequence[str]) -> None:
    """Refuse --user-arms that name an arm the multi-user benchmark does not have."""
    unknown = [arm for arm in arms if arm not in MULTI_USER_ARMS]
    if unknown or not arms:
        raise ValueError(f"--user-arms takes one or more of {', '.join(MULTI_USER_ARMS)}; got {', '.join(arms) or 'none'}")


def check_users(users: Sequence[str]) -> None:
    unknown = [user for user in users if user not in PERSONAS]
    if unknown or len(users) < 2 or len(set(users)) != len(users):
        raise ValueError(f"--users takes two or more different personas of {', '.join(PERSONAS)}; got {','.join(users)}")

