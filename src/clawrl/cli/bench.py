"""The learning benchmark's commands: `clawrl bench learn`, `clawrl bench merge` and `clawrl demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from clawrl.cli.flags import config_from_args
from clawrl.config import BenchConfig, EngineConfig
from clawrl.preflight import check_model, check_writable_dir, is_locally_built


def cmd_bench_learn(args: argparse.Namespace) -> int:
    from clawrl.sim.bench import given_train_flags, pretrain_config, run_bench
    from clawrl.sim.report import report_table

    config = config_from_args(BenchConfig, args)
    check_writable_dir(config.out, "--out")
    if not is_locally_built(config.model):
        check_model(config.model)
    try:
        pretrain_config(config)  # a style mix it cannot read, or one for a model it does not pre-train: refused now
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.users:
        return _bench_learn_users(config, given_train_flags(args))
    results = run_bench(config, given_train_flags(args))
    print(f"\n{report_table(results)}\n\nwrote {config.out / 'results.json'}, {config.out / 'report.md'}, "
          f"{config.out / 'learning.png'}")
    return 0


def _bench_learn_users(config: BenchConfig, train_flags: dict[str, Any]) -> int:
    from clawrl.sim.multi_user import check_arms, check_users, multi_user_table, run_multi_user_bench

    try:
        check_users(config.users)
        check_arms(config.user_arms)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results = run_multi_user_bench(config, config.users, train_flags)
    print(f"\n{multi_user_table(results)}\n\nwrote {config.out / 'results.json'}")
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


def cmd_demo(args: argparse.Namespace) -> int:
    from clawrl.sim.demo import run_demo

    check_writable_dir(Path(args.run_dir), "--run-dir")
    if is_locally_built(args.model):
        check_writable_dir(EngineConfig().cache_dir, "CLAWRL_CACHE_DIR")
    else:
        check_model(args.model)
    return run_demo(Path(args.run_dir), sessions=args.sessions, model=args.model)
