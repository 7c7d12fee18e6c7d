"""The `clawrl` command. Each command reads its settings once, as one object (`ServeSettings` for
`clawrl serve`, ...: `clawrl.config.commands`), and every field of its components is also a flag:
`--max-batch-size 8` sets `ServeSettings.engine.max_batch_size`; flags win over `CLAWRL_*`
environment variables, which win over defaults.

Every command checks what it can before it loads a model or opens a port (`clawrl.preflight`): a
mistake ends it in one `error: ...` line with what to do, exit status 1, and no traceback
(`--debug`, or CLAWRL_DEBUG=1, shows it).

The package, one concern a module: `entry` (`main`), `parser` (every command and its flags),
`flags` (settings as flags, and the flags every command takes), `common` (the run's store, JSON
output), and the commands by subject: `loops` (serve, judge, train), `records` (versions,
sessions, export, feedback, dashboard), `models` (model build-*, plan), `bench` (bench, demo),
`envs` (envs, rollout).
"""

from __future__ import annotations

from clawrl.cli.entry import main
from clawrl.cli.flags import config_from_args
from clawrl.cli.loops import _exit_on_signal, _stop_signalled
from clawrl.cli.parser import build_parser

__all__ = ["_exit_on_signal", "_stop_signalled", "build_parser", "config_from_args", "main"]
