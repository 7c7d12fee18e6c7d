"""The `clawrl` command. Each command reads its settings once, as one object (`ServeSettings` for
`clawrl serve`, ...: `clawrl.config.commands`), and every field of its components is also a flag:
`--max-batch-size 8` sets `ServeSettings.engine.max_batch_size`; flags win over `CLAWRL_*`
environment variables, which win over defaults.

Every command checks what it can before it loads a model or opens a port (`clawrl.preflight`): a
mistake ends it in one `error: ...` line with what to do, exit status 1, and no traceback
(`--debug`, or CLAWRL_DEBUG=1, shows it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import traceback
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from clawrl.allocator import limit_malloc_arenas
from clawrl.config import (
    BenchConfig,
    CommandSettings,
    ComponentSettings,
    DashboardSettings,
    EngineConfig,
    EnvConfig,
    EnvsServeSettings,
    JudgeConfig,
    JudgeSettings,
    RolloutSettings,
    ServeSettings,
    StoreConfig,
    TrainConfig,
    TrainSettings,
    describe_settings_error,
)
from clawrl.logs import LOG_FORMATS, chosen_format, configure_logging, uvicorn_logging
from clawrl.preflight import (
    StartupError,
    check_device,
    check_engine,
    check_model,
    check_port,
    check_server,
    check_store,
    check_writable_dir,
    check_writable_file,
    describe_failure,
    is_locally_built,
)

from clawrl.types import SHARED_LINEAGE

# A settings class a command reads: one component's, or a whole command's.
Settings = TypeVar("Settings", bound=ComponentSettings | CommandSettings)


def add_config_flags(parser: argparse.ArgumentParser, *configs: type[ComponentSettings | CommandSettings]) -> None:
    """One `--flag` per field of each config class (of each component of a command's settings);
    unset flags leave the field to env/defaults."""
    seen: set[str] = set()
    components = [part for config in configs
                  for part in (config.components().values() if issubclass(config, CommandSettings) else [config])]
    for config in components:
        group = parser.add_argument_group(config.__name__, config.__doc__)
        for name, info in config.model_fields.items():
            if name in seen:
                continue
            seen.add(name)
            flag = "--" + name.replace("_", "-")
            kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": info.description}
            annotation = _strip_optional(info.annotation)
            if annotation is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif typing.get_origin(annotation) is typing.Literal:
                kwargs["choices"] = typing.get_args(annotation)
            elif annotation in (int, float, Path):
                kwargs["type"] = annotation
            group.add_argument(flag, **kwargs)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return options[0] if len(options) == 1 else str
    return annotation


def config_from_args(config: type[Settings], args: argparse.Namespace) -> Settings:
    """The settings `config` from the flags that were given (the rest come from the environment):
    a command's (`ServeSettings`: each component, then the rules across them) or one component's.

    A setting the config refuses (a bad value, or flags that do not go together) ends the command
    with a one-line error: this is where every command reads its settings.
    """
    try:
        return config.from_flags(vars(args))
    except ValidationError as error:
        raise StartupError(describe_settings_error(config, error)) from None


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


# --- commands ---------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    # every setting is checked before the model is loaded, which can take minutes
    settings = config_from_args(ServeSettings, args)
    engine_config, store_config, serve_config = settings.engine, settings.store, settings.serve
    check_engine(engine_config)
    check_port(serve_config.host, serve_config.port)
    check_writable_dir(store_config.run_dir, "--run-dir")
    model = _checked_model(engine_config)
    judge_config, judge_reason = _chosen_judge(settings.judge, model.model)
    _check_judge_model(judge_config)
    store = _open_store(store_config)
    logging.getLogger("clawrl").info("judge: %s (%s)", judge_config.judge, judge_reason)
    # imported once everything is checked: they take seconds (torch, transformers)
    import uvicorn

    from clawrl.engines import build_engine
    from clawrl.serve.app import create_app

    engine = build_engine(engine_config, _resolved_model(model))
    judge = _judge_worker(store, judge_config, engine, engine_config, settings.train.teacher)
    trainer = _trainer_process(settings)
    app = create_app(engine, store, serve_config, judge, trainer)
    logging.getLogger("clawrl").info("serving %s on http://%s:%d/v1", engine_config.model, serve_config.host, serve_config.port)
    try:
        # uvicorn shuts down gracefully on SIGTERM (in-flight requests and streams finish, the judge
        # stops), then raises the signal again for the handler it found; as an exception (not the
        # default: die at once) it lets `finally` stop the trainer. A stop asked for is a success.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        uvicorn.run(app, host=serve_config.host, port=serve_config.port, timeout_keep_alive=serve_config.keep_alive_s,
                    timeout_graceful_shutdown=10, **uvicorn_logging())
    except SystemExit as stop:
        if stop.code != 128 + signal.SIGTERM:
            raise
    finally:
        if trainer is not None:
            trainer.stop()
    logging.getLogger("clawrl").info("stopped")
    return 0


def _checked_model(config: EngineConfig) -> EngineConfig:
    """`config` with `--model` checked: a local model directory, a hub id (its snapshot directory
    when it is complete in the local Hugging Face cache), or the name of a locally built model
    (built by `_resolved_model`). Loads nothing."""
    if is_locally_built(config.model):
        check_writable_dir(config.cache_dir, "--cache-dir")
        return config
    return config.model_copy(update={"model": check_model(config.model, needs_weights=config.engine != "openai")})


def _resolved_model(config: EngineConfig) -> str:
    """The weights `--model` names; the locally built models (`tiny`, ...) are built on first use."""
    from clawrl.sim.models import resolve_model

    return resolve_model(config)


def _check_judge_model(config: JudgeConfig) -> None:
    """A second model for `--judge engine[+rule] --judge-model` must be loadable too (the judge loads it later)."""
    if config.judge in ("engine", "engine+rule") and config.judge_model and not is_locally_built(config.judge_model):
        check_model(config.judge_model, flag="--judge-model")


def _open_store(config: StoreConfig, must_exist: bool = False) -> Any:
    """The run's store, after checking that it can be opened (URL, driver, server, schema version)."""
    from clawrl.store import Store

    url = config.resolved_database_url()
    check_store(url, must_exist=must_exist and config.database_url is None,
                where_flag="--run-dir" if config.database_url is None else "--database-url")
    return Store(url)


# Set by a stop signal. The SystemExit the handler raises is lost when the signal lands while the
# main thread runs a `__del__` (Python prints "Exception ignored in ..." and goes on; seen in CI
# with the regex module's `Group.__del__`), so a loop that must end on a stop also checks this.
_stop_signalled = threading.Event()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    _stop_signalled.set()
    sys.exit(128 + signum)


def _trainer_process(settings: ServeSettings) -> Any:
    """With --method, the trainer runs beside the server as its own OS process (never inside it),
    with the settings of serve's that `clawrl train` reads (`TrainSettings`), as CLAWRL_* variables."""
    if settings.train.method is None:
        return None
    from clawrl.trainer_process import TrainerProcess

    return TrainerProcess(settings.engine, settings.store, settings.train, settings.background).start()


def _chosen_judge(config: JudgeConfig, served_model: str | None) -> tuple[JudgeConfig, str]:
    """`config` with the judge `--judge auto` stands for, and why it was chosen (logged once all is checked)."""
    from clawrl.judge.choice import choose_judge

    choice = choose_judge(config, served_model)
    return config.model_copy(update={"judge": choice.judge}), choice.reason


def _judge_worker(
    store: Any, config: JudgeConfig, serving_engine: Any = None, engine_config: Any = None, teacher: Any = "base"
) -> Any:
    from clawrl.judge.worker import build_worker

    try:
        return build_worker(store, config, serving_engine, engine_config, teacher)
    except ValueError as error:
        raise StartupError(str(error)) from None


def cmd_judge(args: argparse.Namespace) -> int:
    import asyncio

    settings = config_from_args(JudgeSettings, args)
    if settings.judge.judge == "off":
        print("error: --judge off leaves nothing to run", file=sys.stderr)
        return 2
    config, reason = _chosen_judge(settings.judge, None)
    _check_judge_model(config)
    store = _open_store(settings.store, must_exist=True)
    logging.getLogger("clawrl").info("judge: %s (%s)", config.judge, reason)
    from clawrl.background import step_back  # with torch: seconds

    step_back(settings.background)
    worker = _judge_worker(store, config)
    if args.once:
        print(f"judged {asyncio.run(_judge_until_done(worker))} turn(s)")
        return 0
    logging.getLogger("clawrl").info("judging with the %s backend as %s", config.judge, worker.worker_id)
    asyncio.run(worker.run_forever())
    return 0


async def _judge_until_done(worker: Any) -> int:
    """Judge in rounds until a round writes nothing (everything judged, or only failures left)."""
    total = 0
    while judged := await worker.judge_available():
        total += judged
    return total


def cmd_train(args: argparse.Namespace) -> int:
    settings = config_from_args(TrainSettings, args)
    config, store_config, engine_config = settings.train, settings.store, settings.engine
    if engine_config.engine == "hf":
        check_device(engine_config.device)
    check_writable_dir(store_config.run_dir, "--run-dir")
    model = _checked_model(engine_config)
    store = _open_store(store_config)
    from clawrl.background import step_back
    from clawrl.trainer_process import exit_with_parent
    from clawrl.train.trainer import Trainer, TrainerLockedError, trainer_lock

    # SIGTERM (from `clawrl serve` shutting down) unwinds like Ctrl-C: a step in progress is lost,
    # its samples stay ready, and nothing half-written is ever registered.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    posture = step_back(settings.background, engine_config.cpu_threads)
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    try:
        with trainer_lock(store_config.run_dir):
            update = {"model": _resolved_model(model), "cpu_threads": posture.threads}
            engine_config = engine_config.model_copy(update=update)
            trainer = Trainer(config, engine_config, store, store_config.run_dir)
            try:
                trainer.start()
                made = trainer.run(max_steps=args.steps, idle_exit_s=args.idle_exit_s, stop=_stop_signalled)
            finally:
                trainer.close()
    except TrainerLockedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    logging.getLogger("clawrl").info("trainer stopped after %d step(s)", made)
    return 0


def cmd_versions_list(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from clawrl.store.training import TrainingStore

    training = TrainingStore(_store(args))
    serving = training.serving_version(args.lineage)
    versions = [
        {"version": row.version, "lineage": row.lineage, "created_at": row.created_at, "parent": row.parent,
         "metrics": asdict(row.metrics), "step": row.step, "kind": row.kind, "serving": row.version == serving}
        for row in training.versions(args.lineage)
    ]  # fmt: skip
    if args.json:
        _print_json(versions)
        return 0
    print(f"{'version':>7} {'parent':>6} {'step':>5} {'samples':>7} {'loss':>9} {'reward':>7} created")
    for item in versions:
        metrics, marker = item["metrics"], "  <- serving" if item["serving"] else ""
        print(f"{'v' + str(item['version']):>7} {'v' + str(item['parent']):>6} {item['step']:>5} {metrics.get('num_samples', 0):>7} "
              f"{metrics.get('loss', 0.0):>9.4f} {metrics.get('mean_reward', 0.0):>7.3f} {_local_time(item['created_at'])}{marker}")
    if serving == 0:
        print("serving: v0 (the base model)")
    return 0


def _local_time(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def cmd_versions_rollback(args: argparse.Namespace) -> int:
    from clawrl.store.training import TrainingStore

    text = args.version.lower().removeprefix("v")
    if not text.isdigit():
        print(f"error: {args.version!r} is not a version (write v3 or 3)", file=sys.stderr)
        return 2
    try:
        TrainingStore(_store(args)).rollback(int(text), args.lineage)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    print(f"serving v{int(text)}; the trainer continues from its weights")
    return 0


def cmd_build_tiny(args: argparse.Namespace) -> int:
    check_writable_dir(Path(args.out), "--out")
    if args.pretrain:
        import shutil

        from clawrl.sim.pretrain import pretrained_model_path

        # built once into the cache (minutes), then copied: `--model tiny-pretrained` reuses the same build
        cached = pretrained_model_path(EngineConfig().cache_dir, seed=args.seed)
        shutil.copytree(cached, args.out, dirs_exist_ok=True)
        print(args.out)
        return 0
    from clawrl.sim.tiny import build_tiny_model

    path = build_tiny_model(Path(args.out), seed=args.seed)
    print(path)
    return 0


def cmd_build_random(args: argparse.Namespace) -> int:
    check_writable_dir(Path(args.out), "--out")
    check_device(args.device)
    from clawrl.model.shapes import architecture_of, build_random_model
    from clawrl.sim.corpus import build_corpus
    from clawrl.sim.tiny import CORPUS_SEED, train_tokenizer

    # the tiny model's tokenizer, widened to the architecture's vocabulary by made-up merges
    tokenizer = train_tokenizer(build_corpus(CORPUS_SEED))
    path = build_random_model(Path(args.out), architecture_of(args.like), tokenizer, dtype=args.dtype, seed=args.seed,
                              device=args.device)  # fmt: skip
    print(path)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from clawrl.model.plan import Workload, plan, table
    from clawrl.model.shapes import architecture_of, architecture_of_config

    if args.model:
        config_file = Path(check_model(args.model, needs_weights=False)) / "config.json"
        shape = architecture_of_config(json.loads(config_file.read_text()))
    else:
        shape = architecture_of(args.like)
    fields = {name: getattr(args, name) for name in Workload.__dataclass_fields__ if hasattr(args, name)}
    result = plan(shape, Workload(**fields, dtype_bytes=2 if args.dtype == "bfloat16" else 4), args.gpu_memory)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(table(result))
    return 0 if result.fits is not False else 2


def _store(args: argparse.Namespace) -> Any:
    """The existing store of the run that --run-dir (or --database-url) names, for the commands that read one."""
    return _open_store(config_from_args(StoreConfig, args), must_exist=True)


def cmd_sessions_list(args: argparse.Namespace) -> int:
    from clawrl.store.inspect import session_summary

    sessions = [session_summary(s) for s in _store(args).list_sessions(limit=args.limit)]
    if args.json:
        _print_json(sessions)
        return 0
    print(f"{'session':<40} {'turns':>5} {'source':<9} {'done':<5} updated")
    for s in sessions:
        print(f"{s['id']:<40} {s['turns']:>5} {s['id_source']:<9} {str(s['done']):<5} {s['updated_at']}")
    return 0


def cmd_sessions_show(args: argparse.Namespace) -> int:
    from clawrl.store.inspect import session_detail

    detail = session_detail(_store(args), args.session_id)
    if detail is None:
        print(f"error: no session {args.session_id!r}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(detail)
        return 0
    print(f"session {detail['id']} ({detail['id_source']}, {detail['turns'] and len(detail['turns'])} turns, done={detail['done']})")
    for turn in detail["turns"]:
        print(f"\n[{turn['index']}] {turn['kind']} v{turn['policy_version']} {turn['finish_reason']} "
              f"prompt={len(turn['prompt_token_ids'])} response={len(turn['response_token_ids'])} tokens")
        print(f"  answer: {turn['response_text'][:200]!r}")
        if turn["tool_calls"]:
            print(f"  tool calls: {json.dumps(turn['tool_calls'])[:200]}")
        if turn["next_state"]:
            print(f"  next state ({turn['next_state']['role']}): {turn['next_state']['content'][:200]!r}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from clawrl.store.inspect import export_jsonl

    check_writable_file(Path(args.out), "--out")
    count = export_jsonl(_store(args), Path(args.out))
    print(f"wrote {count} main turns to {args.out}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import uvicorn

    from clawrl.dashboard.routes import create_dashboard_app

    settings = config_from_args(DashboardSettings, args)
    config = settings.dashboard
    check_port(config.dashboard_host, config.dashboard_port, "--dashboard-port", "--dashboard-host")
    app = create_dashboard_app(_open_store(settings.store, must_exist=True), config.api_key, str(settings.store.run_dir))
    logging.getLogger("clawrl").info("dashboard on http://%s:%d/dashboard", config.dashboard_host, config.dashboard_port)
    uvicorn.run(app, host=config.dashboard_host, port=config.dashboard_port, **uvicorn_logging())
    return 0


def cmd_feedback(args: argparse.Namespace) -> int:
    store = _store(args)
    turn = store.turn(args.turn) if args.turn else store.last_main_turn(args.session)
    if turn is None:
        print(f"error: no turn {args.turn!r}" if args.turn else f"error: session {args.session!r} has no main turn", file=sys.stderr)
        return 1
    store.add_feedback(turn.id, args.score, args.text)
    print(f"recorded {'+1' if args.score > 0 else '-1'} for turn {turn.id}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from clawrl.sim.demo import run_demo

    check_writable_dir(Path(args.run_dir), "--run-dir")
    if is_locally_built(args.model):
        check_writable_dir(EngineConfig().cache_dir, "CLAWRL_CACHE_DIR")
    else:
        check_model(args.model)
    return run_demo(Path(args.run_dir), sessions=args.sessions, model=args.model)


def cmd_bench_learn(args: argparse.Namespace) -> int:
    from clawrl.sim.bench import given_train_flags, run_bench
    from clawrl.sim.report import report_table

    config = config_from_args(BenchConfig, args)
    check_writable_dir(config.out, "--out")
    if not is_locally_built(config.model):
        check_model(config.model)
    results = run_bench(config, given_train_flags(args))
    print(f"\n{report_table(results)}\n\nwrote {config.out / 'results.json'}, {config.out / 'report.md'}, "
          f"{config.out / 'learning.png'}")
    return 0


def cmd_bench_merge(args: argparse.Namespace) -> int:
    from clawrl.sim.report import merge_reports, report_table

    missing = [str(d) for d in args.run_dirs if not (d / "results.json").is_file() or not (d / "runs.json").is_file()]
    if missing:
        print(f"error: no results.json and runs.json in {', '.join(missing)} (a finished `clawrl bench learn --out`)",
              file=sys.stderr)
        return 2
    try:
        results = merge_reports(args.run_dirs, args.out, args.summary)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"\n{report_table(results)}\n\nwrote {args.out / 'results.json'}, {args.out / 'report.md'}, "
          f"{args.out / 'learning.png'}")
    return 0


def cmd_envs_list(args: argparse.Namespace) -> int:
    import asyncio

    from clawrl.envs.registry import describe_environments

    described = asyncio.run(describe_environments(config_from_args(EnvConfig, args)))
    if args.json:
        _print_json(described)
        return 0
    for item in described:
        print(f"{item['name']:<10} {item['train_tasks']:>5} train {item['eval_tasks']:>5} eval  {item['description']}")
    return 0


def _environment_or_exit(config: EnvConfig) -> Any:
    """The environment class `--env` names, once one was made with the settings given (its tasks
    directory or instances file, its micro split), or exit with the error that says what is wrong."""
    from clawrl.envs.registry import environment_class

    if config.terminal_tasks_dir is not None and not config.terminal_tasks_dir.is_dir():
        raise StartupError(f"--terminal-tasks-dir {config.terminal_tasks_dir}: no such directory",
                           "give a directory of terminal task folders, or leave it unset for the built-in tasks")
    if config.swe_instances is not None and not config.swe_instances.is_file():
        raise StartupError(f"--swe-instances {config.swe_instances}: no such file",
                           "give a JSON Lines file of SWE instances, or leave it unset for the built-in instances")
    try:
        kind = environment_class(config.env)
    except ValueError as error:
        raise StartupError(str(error), "pick one with --env (`clawrl envs list`)") from None
    try:
        kind(config)  # its micro-split flags (--web-families, --swe-kinds, ...) are checked when it is made
    except ValueError as error:
        raise StartupError(str(error)) from None
    return kind


def cmd_envs_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from clawrl.envs.http import create_env_app
    from clawrl.envs.registry import make_environment

    settings = config_from_args(EnvsServeSettings, args)
    config, server = settings.env, settings.server
    description = _environment_or_exit(config).description
    check_port(server.host, server.port)
    app = create_env_app(lambda: make_environment(config), description, server.max_episodes, server.idle_timeout_s,
                         server.step_timeout_s)  # fmt: skip
    logging.getLogger("clawrl").info("serving the %s environment on http://%s:%d", config.env, server.host, server.port)
    uvicorn.run(app, host=server.host, port=server.port, **uvicorn_logging())
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    import asyncio

    from clawrl.envs.rollout import rollout

    settings = config_from_args(RolloutSettings, args)
    env_config, config = settings.env, settings.rollout
    _environment_or_exit(env_config)
    if config.record is not None:
        check_writable_file(config.record, "--record")
    if config.server is not None:
        check_server(config.server, config.api_key)
    summary = asyncio.run(rollout(env_config, config))
    if args.json:
        _print_json(summary)
    else:
        print(f"{summary['episodes']} episodes, {summary['failed']} failed, mean reward {summary['mean_reward']}")
    return 0


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
                         help="the trainer maps the server's base weights (on a CPU with --share-weights, the default)")
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
    listing.set_defaults(handler=cmd_sessions_list)
    show = sessions.add_parser("show", help="show one session's turns with their token ids and next states")
    show.add_argument("session_id")
    add_config_flags(show, StoreConfig)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=cmd_sessions_show)

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


DEBUG_HELP = "on an error, show the traceback instead of one line (also CLAWRL_DEBUG=1)"


LOG_FORMAT_HELP = "log lines as text or as JSON objects, one per line (also CLAWRL_LOG_FORMAT)"


def _add_global_flags(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """`--debug` and `--log-format` on `clawrl` and on every subcommand, so that they work wherever they are written."""
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS, help=DEBUG_HELP)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None if top else argparse.SUPPRESS, help=LOG_FORMAT_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_global_flags(sub, top=False)


def main(argv: list[str] | None = None) -> int:
    """Run one command. A mistake it can name (a bad setting, a taken port, a model that is not
    there, a store it cannot open) ends it with one `error: ...` line and exit status 1; `--debug`
    shows the traceback too. Anything else is a bug and keeps its traceback."""
    limit_malloc_arenas()  # before any thread starts
    args = build_parser().parse_args(argv)
    try:
        configure_logging(chosen_format(args.log_format))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    debug = args.debug or os.environ.get("CLAWRL_DEBUG", "").lower() in ("1", "true", "yes")
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as error:
        if not isinstance(error, StartupError):
            raise
        if debug:
            traceback.print_exc()
        print(error.message, file=sys.stderr)
        return 1
    except Exception as error:
        message = None if debug else describe_failure(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
