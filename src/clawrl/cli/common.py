"""What several commands share: the run's store, opened once it is checked, and JSON on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from clawrl.cli.flags import config_from_args
from clawrl.config import StoreConfig
from clawrl.preflight import check_store


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def _open_store(config: StoreConfig, must_exist: bool = False) -> Any:
    """The run's store, after checking that it can be opened (URL, driver, server, schema version)."""
    from clawrl.store import Store

    url = config.resolved_database_url()
    check_store(url, must_exist=must_exist and config.database_url is None,
                where_flag="--run-dir" if config.database_url is None else "--database-url")
    return Store(url)


def _store(args: argparse.Namespace) -> Any:
    """The existing store of the run that --run-dir (or --database-url) names, for the commands that read one."""
    return _open_store(config_from_args(StoreConfig, args), must_exist=True)
