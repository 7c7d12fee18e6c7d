"""How `clawrl` logs: readable lines for a person at a terminal, or JSON lines for a log pipeline.

`--log-format json` (or CLAWRL_LOG_FORMAT=json) writes one JSON object per record to stderr, with
the time, level, logger, message, process id, the traceback of an exception, and any fields a
call passes as `extra=`. The choice is put in the environment, so that the processes a command
starts (the trainer of `clawrl serve`) log the same way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_FORMAT_VARIABLE = "CLAWRL_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# what every LogRecord has: anything else on a record came from `extra=` and is written as a field
_RECORD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        line |= {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def chosen_format(flag: str | None) -> LogFormat:
    """The flag's format, else the environment's, else text."""
    value = (flag or os.environ.get(LOG_FORMAT_VARIABLE) or "text").lower()
    if value not in LOG_FORMATS:
        raise ValueError(f"{LOG_FORMAT_VARIABLE}={value!r} is not a log format; use text or json")
    return value  # type: ignore[return-value]


def configure_logging(log_format: LogFormat) -> None:
    """Log INFO and above to stderr in `log_format`, here and in the processes this one starts."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    os.environ[LOG_FORMAT_VARIABLE] = log_format
    if log_format == "json":  # nothing else may write to stderr: warnings become records, progress bars go
        logging.captureWarnings(True)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers' bars follow the hub's switch
        sys.unraisablehook = _log_unraisable  # "Exception ignored in ...", which Python writes itself


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """An exception Python could not raise (one from a `__del__`, say) as a warning record."""
    error = unraisable.exc_value
    exc_info = (unraisable.exc_type, error, unraisable.exc_traceback) if error is not None else None
    where = unraisable.err_msg or "Exception ignored in"
    logging.getLogger("clawrl").warning("%s: %r", where, unraisable.object, exc_info=exc_info)


def uvicorn_logging() -> dict[str, Any]:
    """`uvicorn.run`'s logging arguments: warnings and errors only; in JSON, through the root logger's handler
    (without a config of its own, uvicorn's loggers pass their records up to it)."""
    settings: dict[str, Any] = {"log_level": "warning"}
    if os.environ.get(LOG_FORMAT_VARIABLE) == "json":
        settings["log_config"] = None
    return settings
