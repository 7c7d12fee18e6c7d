"""The commands over a run's store: `clawrl versions` (list, rollback, pin, unpin), `clawrl sessions` (list,
show), `clawrl export`, `clawrl feedback` and `clawrl dashboard`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from clawrl.cli.common import _open_store, _print_json, _store
from clawrl.cli.flags import config_from_args
from clawrl.config import DashboardSettings
from clawrl.logs import uvicorn_logging
from clawrl.preflight import check_port, check_writable_file


def cmd_versions_list(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    training = _store(args).training
    serving = training.serving_version(args.lineage)
    versions = [
        {"version": row.version, "lineage": row.lineage, "created_at": row.created_at, "parent": row.parent,
         "metrics": asdict(row.metrics), "step": row.step, "kind": row.kind, "serving": row.version == serving,
         "pinned": row.pinned, "pruned": row.pruned}
        for row in training.versions(args.lineage)
    ]  # fmt: skip
    if args.json:
        _print_json(versions)
        return 0
    print(f"{'version':>7} {'parent':>6} {'step':>5} {'samples':>7} {'loss':>9} {'reward':>7} {'weights':<7} created")
    for item in versions:
        metrics, marker = item["metrics"], "  <- serving" if item["serving"] else ""
        weights = "pruned" if item["pruned"] else "pinned" if item["pinned"] else "kept"
        print(f"{'v' + str(item['version']):>7} {'v' + str(item['parent']):>6} {item['step']:>5} {metrics.get('num_samples', 0):>7} "
              f"{metrics.get('loss', 0.0):>9.4f} {metrics.get('mean_reward', 0.0):>7.3f} {weights:<7} "
              f"{_local_time(item['created_at'])}{marker}")
    if serving == 0:
        print("serving: v0 (the base model)")
    return 0


def _local_time(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _version_number(text: str) -> int | None:
    """`v3` or `3` as 3; None for anything else."""
    digits = text.lower().removeprefix("v")
    return int(digits) if digits.isdigit() else None


def cmd_versions_rollback(args: argparse.Namespace) -> int:
    from clawrl.store.pruning import VersionPrunedError

    number = _version_number(args.version)
    if number is None:
        print(f"error: {args.version!r} is not a version (write v3 or 3)", file=sys.stderr)
        return 2
    try:
        _store(args).training.rollback(number, args.lineage)
    except (KeyError, VersionPrunedError) as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    print(f"serving v{number}; the trainer continues from its weights")
    return 0


def cmd_versions_pin(args: argparse.Namespace) -> int:
    """`versions pin` and `versions unpin`: which one is `args.pinned`."""
    from clawrl.store.pruning import VersionPrunedError

    number = _version_number(args.version)
    if number is None or number == 0:
        print(f"error: {args.version!r} is not a published version (write v3 or 3; v0, the base, is always kept)",
              file=sys.stderr)
        return 2
    try:
        _store(args).training.set_pinned(number, args.pinned, args.lineage)
    except (KeyError, VersionPrunedError) as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    print(f"v{number} is pinned: --keep-versions keeps it and its parents" if args.pinned
          else f"v{number} is no longer pinned: --keep-versions may remove its weights")
    return 0


def cmd_sessions_list(args: argparse.Namespace) -> int:
    from clawrl.store.inspect import session_summary

    sessions = [session_summary(s) for s in _store(args).turns.list_sessions(args.limit, args.user)]
    if args.json:
        _print_json(sessions)
        return 0
    print(f"{'session':<40} {'user':<12} {'turns':>5} {'source':<9} {'done':<5} updated")
    for s in sessions:
        print(f"{s['id']:<40} {s['user']:<12} {s['turns']:>5} {s['id_source']:<9} {str(s['done']):<5} {s['updated_at']}")
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
    no_train = "" if detail["train"] else ", never trained on (its first request opted out)"
    print(f"session {detail['id']} ({detail['id_source']}, {detail['turns'] and len(detail['turns'])} turns, "
          f"done={detail['done']}, user {detail['user']}{no_train})")
    for turn in detail["turns"]:
        opted_out = f" not trained: opted out by the {turn['opt_out']}" if turn["opt_out"] else ""
        print(f"\n[{turn['index']}] {turn['kind']} v{turn['policy_version']} {turn['finish_reason']} "
              f"prompt={len(turn['prompt_token_ids'])} response={len(turn['response_token_ids'])} tokens{opted_out}")
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


def cmd_feedback(args: argparse.Namespace) -> int:
    store = _store(args)
    turn = store.turns.turn(args.turn) if args.turn else store.turns.last_main_turn(args.session)
    if turn is None:
        print(f"error: no turn {args.turn!r}" if args.turn else f"error: session {args.session!r} has no main turn", file=sys.stderr)
        return 1
    store.turns.add_feedback(turn.id, args.score, args.text)
    print(f"recorded {'+1' if args.score > 0 else '-1'} for turn {turn.id}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import uvicorn

    from clawrl.dashboard.routes import create_dashboard_app
    from clawrl.serve.auth import KeyChecker

    settings = config_from_args(DashboardSettings, args)
    config = settings.dashboard
    check_port(config.dashboard_host, config.dashboard_port, "--dashboard-port", "--dashboard-host")
    store = _open_store(settings.store, must_exist=True)
    app = create_dashboard_app(store, KeyChecker(config.api_key, store.users).viewer, str(settings.store.run_dir))
    logging.getLogger("clawrl").info("dashboard on http://%s:%d/dashboard", config.dashboard_host, config.dashboard_port)
    uvicorn.run(app, host=config.dashboard_host, port=config.dashboard_port, **uvicorn_logging())
    return 0
