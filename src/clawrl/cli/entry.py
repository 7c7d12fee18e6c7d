"""`clawrl`'s entry point: parse, set up logging, run the command, and turn a mistake it can name
into one `error: ...` line."""

from __future__ import annotations

import os
import sys
import traceback

from clawrl.allocator import limit_malloc_arenas
from clawrl.cli.parser import build_parser
from clawrl.logs import chosen_format, configure_logging
from clawrl.preflight import StartupError, describe_failure


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
