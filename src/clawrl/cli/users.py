"""`clawrl users`: add, list, remove and rotate the keys of the people who use a server, set their
opt-outs, export their records and forget them (DESIGN §12).

A key is printed once, when it is made, and never stored. The admin key stays `--api-key`.
`forget` cannot be undone, so it asks for `--yes` rather than a prompt a script would hang on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clawrl.cli.common import _open_store, _print_json, _store
from clawrl.cli.flags import config_from_args
from clawrl.config import StoreConfig
from clawrl.preflight import check_writable_file
from clawrl.store.users import UserError
from clawrl.types import User


def cmd_users_add(args: argparse.Namespace) -> int:
    store = _open_store(config_from_args(StoreConfig, args))  # a run may start with its users
    try:
        user, key = store.users.add(args.name)
    except UserError as error:
        return _refused(error)
    print(key)
    print(f"added {user.id}: send 'Authorization: Bearer <key>' (or x-api-key); the key is not shown again", file=sys.stderr)
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    users = _store(args).users.list()
    if args.json:
        _print_json([{"user": user.id, "key_hint": user.key_hint, "created_at": user.created_at,
                      "key_created_at": user.key_created_at, "store": user.store, "train": user.train}
                     for user in users])  # fmt: skip
        return 0
    for user in users:
        print(f"{user.id:<32} {user.key_hint}...  {_opt_outs(user)}")
    return 0


def cmd_users_set(args: argparse.Namespace) -> int:
    if args.store is None and args.train is None:
        print("error: say what to set: --store or --no-store, --train or --no-train", file=sys.stderr)
        return 2
    try:
        user = _store(args).users.set_opt_outs(args.name, store=args.store, train=args.train)
    except UserError as error:
        return _refused(error)
    print(f"{user.id}: {_opt_outs(user)} (a running server follows within a second; what was recorded before "
          "stays as it was)", file=sys.stderr)  # fmt: skip
    return 0


def cmd_users_export(args: argparse.Namespace) -> int:
    from clawrl.store.inspect import export_jsonl

    check_writable_file(Path(args.out), "--out")
    store = _store(args)
    try:
        store.users.get(args.name)
    except UserError as error:
        return _refused(error)
    count = export_jsonl(store, Path(args.out), user_id=args.name)
    print(f"wrote {count} lines of {args.name}'s to {args.out}: their main turns, then their memory notes")
    return 0


def cmd_users_forget(args: argparse.Namespace) -> int:
    from clawrl.versions.forgetting import forget_user

    if not args.yes:
        print(f"error: forgetting {args.name} removes every record of theirs, their lineage and their key, for good; "
              "say --yes to do it (`clawrl users export` first keeps a copy)", file=sys.stderr)  # fmt: skip
        return 2
    config = config_from_args(StoreConfig, args)
    try:
        report = forget_user(_open_store(config, must_exist=True), args.name, remove_account=True, run_dir=config.run_dir,
                             retrain=args.retrain)  # fmt: skip
    except UserError as error:
        return _refused(error)
    if args.json:
        _print_json(report.as_json())
        return 0 if report.retrain_refused is None else 1
    removed = ", ".join(f"{count} {table}" for table, count in report.rows.items() if count) or "no rows"
    print(f"forgot {report.user}: removed {removed}")
    for directory in report.directories_removed:
        print(f"removed {directory}")
    if report.trained_shared:
        versions = ", ".join(f"v{item.version} ({item.lineage}, {item.samples} samples)" for item in report.trained_shared)
        print(f"{versions} trained on {report.user}'s samples; their weights keep that influence")
    if report.retrained is not None:
        retrained = report.retrained
        undone = ", ".join(f"v{version}" for version in retrained.undone_versions)
        print(f"retrain: the {retrained.lineage} lineage serves v{retrained.rolled_back_to} again (undone: {undone}); "
              f"its trainer trains {retrained.samples_ready_again} samples of other users again from there")
    elif report.retrain_refused is not None:
        print(f"error: forgot {report.user}, but cannot retrain: {report.retrain_refused}", file=sys.stderr)
    elif args.retrain and report.trained_shared:
        print("retrain: nothing to undo: the shared lineage's serving version no longer descends from those versions")
    elif report.trained_shared:
        print("--retrain rebuilds the shared lineage without them")
    if not report.log_emptied:
        print("warning: another process held the database's write-ahead log; the removed rows may stay in it until "
              "its next checkpoint", file=sys.stderr)  # fmt: skip
    return 0 if report.retrain_refused is None else 1


def _opt_outs(user: User) -> str:
    return f"{'stored' if user.store else 'never stored'}, {'trained on' if user.train else 'never trained on'}"


def cmd_users_remove(args: argparse.Namespace) -> int:
    try:
        _store(args).users.remove(args.name)
    except UserError as error:
        return _refused(error)
    print(f"removed {args.name}: their key no longer works; their records stay (the admin sees them)", file=sys.stderr)
    return 0


def cmd_users_rotate_key(args: argparse.Namespace) -> int:
    try:
        key = _store(args).users.rotate_key(args.name)
    except UserError as error:
        return _refused(error)
    print(key)
    print(f"a new key for {args.name}; the old one no longer works", file=sys.stderr)
    return 0


def _refused(error: UserError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 1

