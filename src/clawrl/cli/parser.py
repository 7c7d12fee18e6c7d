"""`clawrl`'s parser: every command, its flags (a command's settings as flags, `clawrl.cli.flags`,
and its own), and the handler that runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from clawrl.cli.bench import cmd_bench_learn, cmd_bench_merge, cmd_demo
from clawrl.cli.data import add_data_commands
from clawrl.cli.envs import cmd_envs_list, cmd_envs_serve, cmd_rollout
from clawrl.cli.flags import _add_global_flags, add_config_flags
from clawrl.cli.loops import cmd_judge, cmd_serve, cmd_train
from clawrl.cli.memory import add_memory_commands
from clawrl.cli.models import cmd_build_random, cmd_build_tiny, cmd_plan
from clawrl.cli.users import (
    cmd_users_add,
    cmd_users_export,
    cmd_users_forget,
    cmd_users_list,
    cmd_users_remove,
    cmd_users_rotate_key,
    cmd_users_set,
)
from clawrl.cli.records import (
    cmd_dashboard,
    cmd_export,
    cmd_feedback,
    cmd_sessions_list,
    cmd_sessions_show,
    cmd_versions_list,
    cmd_versions_pin,
    cmd_versions_rollback,
)
from clawrl.config import (
    BenchConfig,
    DashboardSettings,
    EnvConfig,
    EnvsServeSettings,
    JudgeSettings,
    RolloutSettings,
    ServeSettings,
    StoreConfig,
    TrainConfig,
    TrainSettings,
)
from clawrl.model.plan import CUDA_RUNTIME_GIB
from clawrl.types import SHARED_LINEAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clawrl", description="An agent that improves by being used.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve a model behind an OpenAI-compatible API and record every turn")
    add_config_flags(serve, ServeSettings)
    serve.set_defaults(handler=cmd_serve)

    judge = commands.add_parser("judge", help="judge recorded turns from their next state (standalone worker)")
    add_config_flags(judge, JudgeSettings)
    judge.add_argument("--once", action="store_true", help="judge what is judgeable now, then exit")
    judge.set_defaults(handler=cmd_judge)

    model = commands.add_parser("model", help="build models locally").add_subparsers(dest="model_command", required=True)
    tiny = model.add_parser("build-tiny", help="write a tiny Qwen2-architecture model and tokenizer (seconds, no download)")
    tiny.add_argument("--out", required=True, help="directory to write the Hugging Face model to")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the weights and the tokenizer corpus")
    tiny.add_argument("--pretrain", action="store_true",
                      help="pre-train it on the learning benchmark's conversations (minutes on a CPU, once: cached "
                      "under CLAWRL_CACHE_DIR, ~/.cache/clawrl, where `--model tiny-pretrained` finds it)")
    tiny.set_defaults(handler=cmd_build_tiny)
    random_model = model.add_parser("build-random", help="write a random-weight model of a real architecture (Qwen3 "
                                    "0.6B/4B/8B): for measuring cost and memory only, its answers are noise")
    random_model.add_argument("--like", required=True, choices=("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-tiny"),
                              help="the architecture, from the model's published config (qwen3-tiny: its layers "
                              "scaled down, for dry runs)")
    random_model.add_argument("--out", required=True, help="directory to write the Hugging Face model to")
    random_model.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="how the weights are stored")
    random_model.add_argument("--device", default="cpu", help="where the weights are initialised (cuda: seconds for billions)")
    random_model.add_argument("--seed", type=int, default=0, help="seed of the weights and of the widened tokenizer")
    random_model.set_defaults(handler=cmd_build_random)

    planner = commands.add_parser("plan", help="predict the memory of serving and training a model on one device, "
                                  "part by part, and whether it fits (exit status 2 when it does not)")
    which = planner.add_mutually_exclusive_group(required=True)
    which.add_argument("--like", choices=("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-tiny"), help="a known architecture")
    which.add_argument("--model", help="a model directory (or hub id in the local cache): its config.json")
    planner.add_argument("--gpu-memory", type=float, default=None, help="the device's memory in GiB")
    planner.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    planner.add_argument("--prompt-tokens", type=int, default=20000, help="one request's prompt")
    planner.add_argument("--response-tokens", type=int, default=300, help="one answer")
    planner.add_argument("--sessions", type=int, default=8, help="sessions served at once")
    planner.add_argument("--prefix-cache-gib", type=float, default=0.0, help="the hf engine's prefix cache budget")
    planner.add_argument("--train", action=argparse.BooleanOptionalAction, default=True, help="a trainer beside the server")
    planner.add_argument("--full", action="store_true", help="fine-tune every weight instead of a LoRA adapter")
    planner.add_argument("--shared-base", action="store_true",
                         help="the trainer maps the server's base weights (--share-weights, the default: on a CPU, "
                         "and on a GPU with the hf engine)")
    planner.add_argument("--quantize", choices=("none", "nf4"), default="none", help="the base's projections in 4 bits")
    planner.add_argument("--runtime-gib", type=float, default=CUDA_RUNTIME_GIB,
                         help="what each process holds besides its tensors (CUDA context, workspaces); 0 on a CPU")
    planner.add_argument("--lora-rank", type=int, default=16)
    planner.add_argument("--micro-batch-size", type=int, default=4, help="rows per micro-batch (a session's turns)")
    planner.add_argument("--turn-tokens", type=int, default=150, help="what each turn adds besides the last answer")
    planner.add_argument("--share-prefix", action=argparse.BooleanOptionalAction, default=True)
    planner.add_argument("--activation-checkpointing", action="store_true")
    planner.add_argument("--logit-chunk-tokens", type=int, default=1024)
    planner.add_argument("--json", action="store_true", help="the plan as one JSON object")
    planner.set_defaults(handler=cmd_plan)

    sessions = commands.add_parser("sessions", help="inspect recorded sessions").add_subparsers(dest="sessions_command", required=True)
    listing = sessions.add_parser("list", help="list sessions, newest first")
    add_config_flags(listing, StoreConfig)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--limit", type=int, default=100, help="most sessions to list")
    listing.add_argument("--user", default=None, help="only this user's sessions ('default': those made without a user's key)")
    listing.set_defaults(handler=cmd_sessions_list)
    show = sessions.add_parser("show", help="show one session's turns with their token ids and next states")
    show.add_argument("session_id")
    add_config_flags(show, StoreConfig)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=cmd_sessions_show)

    add_memory_commands(commands)

    users = commands.add_parser("users", help="the people who use this server, each with a key of their own")
    user_commands = users.add_subparsers(dest="users_command", required=True)
    for name, handler, help_text in (
        ("add", cmd_users_add, "add a user and print their new key (shown once)"),
        ("remove", cmd_users_remove, "remove a user: their key stops working, their records stay"),
        ("rotate-key", cmd_users_rotate_key, "print a new key for a user; the old one stops working"),
    ):
        action = user_commands.add_parser(name, help=help_text)
        action.add_argument("name", help="the user's name (lowercase letters, digits, '.', '_', '-')")
        add_config_flags(action, StoreConfig)
        action.set_defaults(handler=handler)
    user_list = user_commands.add_parser("list", help="list users with the start of their key")
    add_config_flags(user_list, StoreConfig)
    user_list.add_argument("--json", action="store_true", help="print JSON")
    user_list.set_defaults(handler=cmd_users_list)
    user_set = user_commands.add_parser("set", help="a user's opt-outs: whether their requests are recorded and "
                                        "their turns trained on (a running server follows within a second)")
    user_set.add_argument("name", help="the user's name")
    add_config_flags(user_set, StoreConfig)
    user_set.add_argument("--store", action=argparse.BooleanOptionalAction, default=None,
                          help="--no-store: their requests are answered and never recorded (no session, no turn)")
    user_set.add_argument("--train", action=argparse.BooleanOptionalAction, default=None,
                          help="--no-train: their turns are recorded (theirs to read and export), never judged nor "
                          "trained on")
    user_set.set_defaults(handler=cmd_users_set)
    user_export = user_commands.add_parser("export", help="write a user's main turns as JSON lines, the format of "
                                           "`clawrl export` (what GET /v1/me/data gives their key)")
    user_export.add_argument("name", help="the user's name")
    add_config_flags(user_export, StoreConfig)
    user_export.add_argument("--out", required=True, help="the .jsonl file to write")
    user_export.set_defaults(handler=cmd_users_export)
    user_forget = user_commands.add_parser("forget", help="remove a user and everything of theirs: sessions, turns, "
                                           "verdicts, samples, episodes, feedback, their lineage's versions, their key")
    user_forget.add_argument("name", help="the user's name")
    add_config_flags(user_forget, StoreConfig)
    user_forget.add_argument("--yes", action="store_true", help="do it: forgetting cannot be undone")
    user_forget.add_argument("--retrain", action="store_true", help="with --adapters shared: serve the shared lineage's "
                             "last version before the user's first sample again, and have its trainer rebuild it "
                             "from there on the other users' samples")
    user_forget.add_argument("--json", action="store_true", help="print what was removed as JSON")
    user_forget.set_defaults(handler=cmd_users_forget)

    add_data_commands(commands)

    export = commands.add_parser("export", help="write every main turn as JSON lines (loadable with `datasets`)")
    add_config_flags(export, StoreConfig)
    export.add_argument("--out", required=True, help="the .jsonl file to write")
    export.set_defaults(handler=cmd_export)

    feedback = commands.add_parser("feedback", help="record a thumbs up or down (and a correction) for a turn")
    add_config_flags(feedback, StoreConfig)
    target = feedback.add_mutually_exclusive_group(required=True)
    target.add_argument("--turn", help="the turn id (X-Clawrl-Turn, or the response id)")
    target.add_argument("--session", help="a session id: the feedback is for its latest main turn")
    feedback.add_argument("--score", type=int, choices=[1, -1], required=True, help="1 (good) or -1 (bad)")
    feedback.add_argument("--text", help="what should have been different (a hint candidate)")
    feedback.set_defaults(handler=cmd_feedback)

    dashboard = commands.add_parser("dashboard", help="a web page over a run's store: sessions, verdicts, samples, "
                                    "versions, live score (also at /dashboard of clawrl serve)")
    add_config_flags(dashboard, DashboardSettings)
    dashboard.set_defaults(handler=cmd_dashboard)

    train = commands.add_parser("train", help="train on judged turns and publish policy versions (standalone trainer)")
    add_config_flags(train, TrainSettings)
    train.add_argument("--steps", type=int, default=None, help="stop after this many published versions (default: run until stopped)")
    train.add_argument("--idle-exit-s", type=float, default=None, help="stop after this many seconds without a step")
    train.add_argument("--parent-pid", type=int, default=None, help="stop when this process ends (set by clawrl serve)")
    train.set_defaults(handler=cmd_train)

    versions = commands.add_parser("versions", help="published policy versions").add_subparsers(dest="versions_command", required=True)
    version_list = versions.add_parser("list", help="list published versions and the one serving uses")
    add_config_flags(version_list, StoreConfig)
    version_list.add_argument("--json", action="store_true", help="print JSON")
    version_list.add_argument("--lineage", default=SHARED_LINEAGE, help="whose versions (default: the shared lineage)")
    version_list.set_defaults(handler=cmd_versions_list)
    rollback = versions.add_parser("rollback", help="serve an earlier version again (v0: the base model)")
    rollback.add_argument("version", help="the version to serve, e.g. v3")
    rollback.add_argument("--lineage", default=SHARED_LINEAGE, help="whose pointer moves (default: the shared lineage)")
    add_config_flags(rollback, StoreConfig)
    rollback.set_defaults(handler=cmd_versions_rollback)
    for name, pinned, help_text in (("pin", True, "keep a version's weights whatever --keep-versions says, and its "
                                     "parents back K steps"), ("unpin", False, "let --keep-versions remove a pinned "
                                     "version's weights again")):  # fmt: skip
        pin = versions.add_parser(name, help=help_text)
        pin.add_argument("version", help="the version, e.g. v3")
        pin.add_argument("--lineage", default=SHARED_LINEAGE, help="whose version (default: the shared lineage)")
        add_config_flags(pin, StoreConfig)
        pin.set_defaults(handler=cmd_versions_pin, pinned=pinned)

    bench = commands.add_parser("bench", help="benchmarks of the running system").add_subparsers(dest="bench_command", required=True)
    learn = bench.add_parser("learn", help="does the agent learn a simulated user's preference? arms x seeds, held-out "
                             "scores, sessions to align, a report card and a plot")
    add_config_flags(learn, BenchConfig, TrainConfig)
    learn.set_defaults(handler=cmd_bench_learn)
    merge = bench.add_parser("merge", help="one report from several `bench learn` output directories (arms run "
                             "apart, each with its own settings, on the same seeds and user)")
    merge.add_argument("run_dirs", nargs="+", type=Path, help="`bench learn --out` directories to merge")
    merge.add_argument("--out", type=Path, required=True, help="where the merged results.json, report and plot go")
    merge.add_argument("--summary", type=Path, help="also write the merged results.json here")
    merge.set_defaults(handler=cmd_bench_merge)

    envs = commands.add_parser("envs", help="general-agent environments (DESIGN §9)").add_subparsers(dest="envs_command", required=True)
    envs_list = envs.add_parser("list", help="the environments, with their task counts")
    add_config_flags(envs_list, EnvConfig)
    envs_list.add_argument("--json", action="store_true", help="print JSON")
    envs_list.set_defaults(handler=cmd_envs_list)
    envs_serve = envs.add_parser("serve", help="serve an environment over HTTP in OpenEnv's shape (/reset, /step, "
                                 "/state, /health, /schema)")
    add_config_flags(envs_serve, EnvsServeSettings)
    envs_serve.set_defaults(handler=cmd_envs_serve)

    rollout = commands.add_parser("rollout", help="play episodes of an environment with a scripted policy or a clawrl "
                                  "server's model (recorded in its store for training); a JSONL record and a summary")
    add_config_flags(rollout, RolloutSettings)
    rollout.add_argument("--json", action="store_true", help="print the summary as JSON")
    rollout.set_defaults(handler=cmd_rollout)

    demo = commands.add_parser("demo", help="watch the tiny model learn a simulated user's preference on the CPU "
                               "(the learning benchmark's control and combined arms, one seed)")
    demo.add_argument("--run-dir", default="runs/demo", help="where the runs, the report and the plot are written")
    demo.add_argument("--sessions", type=int, default=36, help="sessions with the simulated user per arm")
    demo.add_argument("--model", default="tiny-pretrained",
                      help="served model: `tiny-pretrained` (built locally on first use) or a directory of one")
    demo.set_defaults(handler=cmd_demo)
    _add_global_flags(parser)
    return parser
