"""The long-running commands, the loops of a run: `clawrl serve` (with the judge in it, or in Ray
actors with `--judge-actors`, and, with `--method`, the trainer beside it), `clawrl judge` and
`clawrl train` on their own.

A stop signal ends each one cleanly; `_stop_signalled` is the one record that a stop was asked for.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from clawrl.cli.common import _open_store
from clawrl.cli.flags import config_from_args
from clawrl.config import EngineConfig, JudgeConfig, JudgeSettings, ServeSettings, TrainSettings
from clawrl.logs import uvicorn_logging
from clawrl.preflight import (
    StartupError,
    check_device,
    check_engine,
    check_model,
    check_port,
    check_writable_dir,
    is_locally_built,
)


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
    _check_judge_placement(judge_config, judge_reason)
    _check_trainer_placement(settings)
    store = _open_store(store_config)
    actors = f", in {judge_config.judge_actors} Ray actors" if judge_config.judge_actors else ""
    logging.getLogger("clawrl").info("judge: %s (%s)%s", judge_config.judge, judge_reason, actors)
    # imported once everything is checked: they take seconds (torch, transformers)
    import uvicorn

    from clawrl.engines import build_engine
    from clawrl.serve.app import create_app

    engine = build_engine(engine_config, _resolved_model(model))
    judge, judges = None, None
    if judge_config.judge_actors:
        from clawrl.cli.ray_judges import JudgeActors

        judges = JudgeActors(settings, judge_config, store).start()
    else:
        judge = _judge_worker(store, judge_config, engine, engine_config, settings.train.teacher,
                              serve_config.memory_limit, serve_config.memory_from)  # fmt: skip
    trainer = _trainer_process(settings)
    app = create_app(engine, store, serve_config, judge, trainer, settings.train.adapters, judges)
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
        if judges is not None:
            judges.stop()
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


# Set by a stop signal. The SystemExit the handler raises is lost when the signal lands while the
# main thread runs a `__del__` (Python prints "Exception ignored in ..." and goes on; seen in CI
# with the regex module's `Group.__del__`), so a loop that must end on a stop also checks this.
_stop_signalled = threading.Event()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    _stop_signalled.set()
    sys.exit(128 + signum)


def _trainer_process(settings: ServeSettings) -> Any:
    """With --method, the trainer runs beside the server as its own OS process (never inside it),
    with the settings of serve's that `clawrl train` reads (`TrainSettings`), as CLAWRL_* variables;
    with --placement ray, in a Ray actor given those settings (`cli/ray_trainer.py`)."""
    if settings.train.method is None:
        return None
    from clawrl.trainer_process import TrainerProcess

    configs = (settings.engine, settings.store, settings.train, settings.background)
    if settings.engine.placement != "ray":
        return TrainerProcess(*configs).start()
    from clawrl.cli.ray_trainer import RayTrainer

    train_settings = TrainSettings(engine=settings.engine, store=settings.store, train=settings.train,
                                   background=settings.background)  # fmt: skip
    return TrainerProcess(*configs, start_trainer=lambda: RayTrainer(run_trainer, train_settings)).start()


def _check_trainer_placement(settings: ServeSettings) -> None:
    """With --placement ray and --method, some node of the cluster must fit one rank of the trainer
    (joins the cluster, or starts one: the replicas need it next anyway)."""
    if settings.engine.placement == "ray" and settings.train.method is not None:
        from clawrl.cli.ray_trainer import unplaceable

        if problem := unplaceable(settings.train):
            raise StartupError(problem, "ask for less, or add a node that has it to the cluster")


def _check_judge_placement(config: JudgeConfig, reason: str) -> None:
    """With --judge-actors, the chosen backend must judge without the served model (no actor holds
    it), and some node of the cluster must fit one actor (joins the cluster, or starts one)."""
    if not config.judge_actors:
        return
    from clawrl.cli.ray_judges import needs_the_served_model, unplaceable

    if needs_the_served_model(config):
        chosen = f"--judge {config.judge}" if reason.startswith("--judge") else \
            f"--judge auto chose {config.judge} ({reason.split(';')[0]}), which"
        raise StartupError(f"{chosen} judges with the served model, which no judge actor holds",
                           "give the actors a model of their own (--judge-model), judge with --judge rule or "
                           "--judge openai, or keep the judge in the server (--judge-actors 0)")  # fmt: skip
    if problem := unplaceable(config):
        raise StartupError(problem, "ask for less, or add a node that has it to the cluster")


def _chosen_judge(config: JudgeConfig, served_model: str | None) -> tuple[JudgeConfig, str]:
    """`config` with the judge `--judge auto` stands for, and why it was chosen (logged once all is checked)."""
    from clawrl.judge.choice import choose_judge

    choice = choose_judge(config, served_model)
    return config.model_copy(update={"judge": choice.judge}), choice.reason


def _judge_worker(
    store: Any, config: JudgeConfig, serving_engine: Any = None, engine_config: Any = None, teacher: Any = "base",
    memory_notes: int | None = None, memory_from: Any = "directives",
) -> Any:
    from clawrl.judge.worker import build_worker

    try:
        return build_worker(store, config, serving_engine, engine_config, teacher, memory_notes, memory_from)
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
    return run_trainer(settings, args.steps, args.idle_exit_s, _stop_signalled, args.parent_pid)


def run_trainer(settings: TrainSettings, steps: int | None = None, idle_exit_s: float | None = None,
                stop: threading.Event = _stop_signalled, parent_pid: int | None = None) -> int:
    """The trainer until `stop` is set (or `steps` made, or idle `idle_exit_s`): `clawrl train`, and
    what the Ray actor of `clawrl serve --placement ray` runs (`cli/ray_trainer.py`). Returns the
    exit status."""
    config, store_config, engine_config = settings.train, settings.store, settings.engine
    if engine_config.engine == "hf":
        check_device(engine_config.device)
    check_writable_dir(store_config.run_dir, "--run-dir")
    model = _checked_model(engine_config)
    store = _open_store(store_config)
    from clawrl.background import step_back
    from clawrl.train.trainer import Trainer, TrainerLockedError, trainer_lock
    from clawrl.trainer_process import exit_with_parent

    if threading.current_thread() is threading.main_thread():  # a process of its own (an actor is stopped by `stop`)
        # SIGTERM (from `clawrl serve` shutting down) unwinds like Ctrl-C: a step in progress is lost,
        # its samples stay ready, and nothing half-written is ever registered.
        signal.signal(signal.SIGTERM, _exit_on_signal)
    posture = step_back(settings.background, engine_config.cpu_threads)
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    try:
        with trainer_lock(store_config.run_dir):
            update = {"model": _resolved_model(model), "cpu_threads": posture.threads}
            engine_config = engine_config.model_copy(update=update)
            trainer = Trainer(config, engine_config, store, store_config.run_dir, server_pid=parent_pid)
            try:
                trainer.start()
                made = trainer.run(max_steps=steps, idle_exit_s=idle_exit_s, stop=stop)
            finally:
                trainer.close()
    except TrainerLockedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    logging.getLogger("clawrl").info("trainer stopped after %d step(s)", made)
    return 0
