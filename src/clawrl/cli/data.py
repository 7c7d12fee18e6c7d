"""`clawrl data`: the key that encrypts what people said in the store (DESIGN §12, at rest).

`new-key` writes a fresh key file (0600, never over an existing file); `rotate-key` re-encrypts
every row under a new key with the old one (`--encrypt-key-file` or `CLAWRL_DATA_KEY`) still read,
and encrypts the rows of a store kept in clear until then.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from clawrl.cli.common import _open_store, _print_json, data_keys, read_key_file
from clawrl.cli.flags import add_config_flags, config_from_args
from clawrl.config import StoreConfig
from clawrl.preflight import StartupError, check_writable_file


def cmd_data_new_key(args: argparse.Namespace) -> int:
    from clawrl.store.encryption import new_key

    path = Path(args.out)
    check_writable_file(path, "--out")
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)  # the owner's alone, from its first byte
    except FileExistsError:
        raise StartupError(f"--out {path} exists", "a key file is never overwritten (its rows would be lost): "
                           "give a new path") from None
    with os.fdopen(descriptor, "w") as out:
        out.write(new_key() + "\n")
    print(f"wrote a new data key to {path}: keep a copy apart from the store (without it the store cannot be read)",
          file=sys.stderr)
    return 0


def cmd_data_rotate_key(args: argparse.Namespace) -> int:
    from clawrl.store.rotation import rotate

    if args.batch < 1:  # 0 read no row and reported success; a negative LIMIT is none on SQLite
        raise StartupError(f"--batch {args.batch}: give a number of rows of 1 or more")
    config = config_from_args(StoreConfig, args)
    new = read_key_file(Path(args.new_key_file), "--new-key-file")
    store = _open_store(config, must_exist=True, keys=new.then(data_keys(config)))
    report = rotate(store, batch=args.batch)
    if args.json:  # the same warnings and exit status as the text: a script must not take a half rotation for done
        _print_json(asdict(report))
    else:
        print(f"rotated to key id {report.key_id}: re-encrypted {sum(report.rewritten.values())} value(s) "
              f"({', '.join(f'{table} {count}' for table, count in report.rewritten.items()) or 'none'}), "
              f"{report.already} already under it, {report.changed_meanwhile} changed meanwhile")
    if report.left:
        print(f"warning: {sum(report.left.values())} value(s) are still under key id {', '.join(report.left)}: a loop "
              "still writes with the old key; restart it with the new key first in its key file and run this again",
              file=sys.stderr)
    if report.left_in_clear:
        print(f"warning: {report.left_in_clear} value(s) are still in clear: a loop started without a key still writes; "
              "restart it with the new key and run this again", file=sys.stderr)
    if not report.log_emptied:  # as `clawrl users forget` says it: the old ciphertexts are in the log until then
        print("warning: another process held the write-ahead log: the values as they were under the old key stay in "
              "it until its next checkpoint overwrites them", file=sys.stderr)
    return 1 if report.left or report.left_in_clear else 0


def add_data_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    data = commands.add_parser("data", help="the key that encrypts conversations in the store")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    new_key = data_commands.add_parser("new-key", help="write a fresh random data key to a new file (mode 0600)")
    new_key.add_argument("--out", required=True, help="the key file to create (never overwritten)")
    new_key.set_defaults(handler=cmd_data_new_key)
    rotate = data_commands.add_parser("rotate-key", help="re-encrypt every row under a new key (the old one from "
                                      "--encrypt-key-file or CLAWRL_DATA_KEY; none: a store in clear is encrypted)")
    rotate.add_argument("--new-key-file", required=True, help="the new key (`clawrl data new-key` writes one)")
    add_config_flags(rotate, StoreConfig)
    rotate.add_argument("--batch", type=int, default=200, help="rows per write transaction")
    rotate.add_argument("--json", action="store_true", help="print the report as JSON")
    rotate.set_defaults(handler=cmd_data_rotate_key)
