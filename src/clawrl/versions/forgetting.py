"""Forgetting a user, files included (DESIGN §12): their rows (`store.users.forget`), then their lineage's directories.

The rows go first, in one transaction: from then on no pointer names the lineage, so a server
stops answering with it (`PolicyFollower` puts it back at the base) and a trainer never loads it
again; the directories go after. A lineage's directory is RUN_DIR/policy/<user>/ where the run
directory is known (`clawrl users forget --run-dir`), which also takes a version a killed trainer
wrote and never registered; else (a server, which knows its store but not its run directory) the
directory that holds each registered version, as the store recorded it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from clawrl.store import Store
from clawrl.store.forgetting import ForgetReport
from clawrl.store.pruning import VersionPrunedError
from clawrl.types import SHARED_LINEAGE
from clawrl.versions.files import lineage_root


def forget_user(store: Store, name: str, remove_account: bool, run_dir: Path | None = None, retrain: bool = False) -> ForgetReport:
    """Forget `name` (UserError when there is nothing of theirs); the report, with the directories removed.
    With `retrain`, the shared lineage goes back to the last version before the user's first sample
    (served at once, without a pause: the follower swaps it in) and its trainer rebuilds it without
    them (`TrainingStore.retrain_from`)."""
    report = store.users.forget(name, remove_account)
    report.directories_removed = [str(path) for path in _remove_lineage(name, report.version_paths, run_dir)]
    shared = [item.version for item in report.trained_shared if item.lineage == SHARED_LINEAGE]
    if retrain and shared:
        try:
            report.retrained = store.training.retrain_from(min(shared), SHARED_LINEAGE)
        except VersionPrunedError as error:  # the forget stands; only the rebuild cannot start
            report.retrain_refused = str(error)
    return report


def _remove_lineage(lineage: str, version_paths: list[str], run_dir: Path | None) -> list[Path]:
    roots = {lineage_root(run_dir, lineage)} if run_dir is not None else set()
    for path in map(Path, version_paths):
        # a version lives at policy/<lineage>/vN: the lineage's directory goes whole (its leftovers too)
        roots.add(path.parent if (path.parent.name, path.parent.parent.name) == (lineage, "policy") else path)
    removed = []
    for root in sorted(roots):
        if root.is_dir():
            shutil.rmtree(root)
            removed.append(root)
    return removed
