"""Experiment trackers (`--report-to tensorboard,trackio,wandb,mlflow`): where the trainer's numbers go.

After each published step the trainer reports its step metrics (`train/loss`, `train/clip_fraction`,
..., `train/version`, `train/step`) and the judge's live score of the version the step started from
(`judge/live_score`: the mean verdict of the turns that version served so far, `judge/judged`: how
many), to every tracker named, at the published version's number: versions only grow, where the
optimizer's step count goes back after a rollback (and W&B refuses a step that goes back). Each library is an optional extra
(`pip install 'clawrl[trackio]'`, `[wandb]`, `[mlflow]`; TensorBoard comes with torch) and is
imported only when named, so a trainer without trackers loads none of them.

Where each one writes, unless its own settings say otherwise:

- **tensorboard**: event files in `RUN_DIR/tensorboard/` (`tensorboard --logdir RUN_DIR/tensorboard`).
- **trackio**: its local store (`TRACKIO_DIR`, by default under `~/.cache/huggingface/trackio`),
  project `--report-project`, one run per run directory (`trackio show --project clawrl`).
- **wandb**: `RUN_DIR/wandb/`; online when W&B has a key (`WANDB_API_KEY` or `wandb login`), else
  offline (`wandb sync RUN_DIR/wandb/offline-run-*` uploads it later); `WANDB_MODE` decides first.
- **mlflow**: `MLFLOW_TRACKING_URI`, else a SQLite store in `RUN_DIR/mlflow.db` (MLflow's recommended
  local backend; its file store is in maintenance mode), experiment `--report-project`
  (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`).
"""

from __future__ import annotations

import logging
import netrc
import os
import time
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record `metrics` (name -> value) at `step`."""

    def close(self) -> None:
        """Flush and end the run."""


def open_trackers(names: list[str], run_dir: Path, project: str, settings: dict[str, Any]) -> list[Tracker]:
    """One tracker per name, each a run named after the run directory, with the trainer's `settings` as its config."""
    openers = {"tensorboard": TensorBoardTracker, "trackio": TrackioTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
    return [openers[name](Path(run_dir), project, settings) for name in names]


class TensorBoardTracker:
    def __init__(self, run_dir: Path, project: str, settings: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class TrackioTracker:
    def __init__(self, run_dir: Path, project: str, settings: dict[str, Any]) -> None:
        import trackio

        self.trackio = trackio
        # no CPU or GPU sampling thread: the trainer reports its own numbers, and the host's are /metrics'
        self.run = trackio.init(project=project, name=run_dir.resolve().name, config=settings, resume="allow",
                                embed=False, auto_log_cpu=False, auto_log_gpu=False)  # fmt: skip

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class WandbTracker:
    def __init__(self, run_dir: Path, project: str, settings: dict[str, Any]) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_has_key() else "offline")
        if mode == "offline":
            log.info("wandb: no W&B key here, so the run is written offline to %s/wandb (wandb sync uploads it)", run_dir)
        self.run = wandb.init(project=project, name=run_dir.resolve().name, dir=str(run_dir), config=settings, mode=mode)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_has_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class MlflowTracker:
    def __init__(self, run_dir: Path, project: str, settings: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.resolve().name).info.run_id
        for name, value in settings.items():
            self.client.log_param(self.run_id, name, str(value)[:6000])  # MLflow caps a parameter's value

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, float(value), now, step) for name, value in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
