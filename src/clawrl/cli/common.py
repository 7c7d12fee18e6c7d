"""What several commands share: the run's store, opened once it is checked, and JSON on stdout."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from clawrl.cli.flags import config_from_args
from clawrl.config import StoreConfig
from clawrl.preflight import StartupError, check_store


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def _open_store(config: StoreConfig, must_exist: bool = False, keys: Any = None) -> Any:
    """The run's store, after checking that it can be opened (URL, driver, server, schema version),
    with the data key the settings give (or the ring `keys`, for a rotation)."""
    from clawrl.store import Store

    url = config.resolved_database_url()
    check_store(url, must_exist=must_exist and config.database_url is None,
                where_flag="--run-dir" if config.database_url is None else "--database-url")
    return Store(url, keys if keys is not None else data_keys(config))


def data_keys(config: StoreConfig) -> Any:
    """The key ring `--encrypt-key-file` or `CLAWRL_DATA_KEY` gives, or None (the store in clear)."""
    if config.data_key is not None:
        return read_keys(config.data_key.get_secret_value(), "CLAWRL_DATA_KEY")
    if config.encrypt_key_file is None:
        return None
    return read_key_file(config.encrypt_key_file, "--encrypt-key-file")


KEY_FILE_MAX_BYTES = 64 * 1024  # a thousand keys' lines; what is longer is not a key file


def read_key_file(path: Path, flag: str) -> Any:
    """The key ring in `path`. At most `KEY_FILE_MAX_BYTES` are read, so that a wrong path (a log, a
    link to /dev/zero) is one error at once, never a process filling its memory; a file that others
    than its owner may read is used, with a warning: whoever reads it reads the store."""
    try:
        with path.open("rb") as file:
            raw = file.read(KEY_FILE_MAX_BYTES + 1)
            mode = os.fstat(file.fileno()).st_mode
        text = raw.decode()
    except (OSError, UnicodeDecodeError) as error:
        raise StartupError(f"{flag} {path}: cannot read it ({getattr(error, 'strerror', None) or error})",
                           "give a file `clawrl data new-key --out FILE` wrote") from None
    if len(raw) > KEY_FILE_MAX_BYTES:
        raise StartupError(f"{flag} {path}: too large to be a key file (over {KEY_FILE_MAX_BYTES} bytes)",
                           "give a file `clawrl data new-key --out FILE` wrote")
    ring = read_keys(text, f"{flag} {path}")
    if stat.S_ISREG(mode) and mode & 0o077:
        print(f"warning: {flag} {path} can be read or written by others (mode {stat.S_IMODE(mode):04o}): whoever reads "
              f"it can read the store; chmod 600 {path}", file=sys.stderr)
    return ring


def read_keys(text: str, where: str) -> Any:
    from clawrl.store.encryption import DataKeyError, KeyRing

    try:
        return KeyRing.from_text(text, where)
    except DataKeyError as error:
        raise StartupError(str(error)) from None


def _store(args: argparse.Namespace) -> Any:
    """The existing store of the run that --run-dir (or --database-url) names, for the commands that read one."""
    return _open_store(config_from_args(StoreConfig, args), must_exist=True)
