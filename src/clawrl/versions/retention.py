"""Bounded disk for policy versions (`--keep-versions K`): the trainer removes the weights nobody needs.

Which versions keep their weights is the store's rule (`store/pruning.py`: the serving version, the
pinned ones, their parents back K steps, the newest). This is the part with files, run by the
trainer after each publish, in its own process, so serving never waits on a directory's removal.

A version leaves the kept set the moment the pointer moves past it, but serving may still need its
directory for a moment after: the follower may be checking and loading it (it was current when the
poll read the pointer), and vLLM reads an adapter from its directory again when it had to evict it
while requests on it were still running. Serving does not tell the store what it holds, and a
write from every poll would put serving in the writers' queue. So a version is removed only once
it has been outside the kept set for `grace_s` (`--keep-versions-grace-s`, 60 s by default: a
hundred poll intervals), as this trainer saw it; after a restart the wait starts again. On disk
that bounds the versions to the kept ones plus those published in the last `grace_s`.

Rows are marked pruned first, in one transaction that decides again under the pointer's lock,
and the directories go after: a rollback or pin never lands on a version about to lose its
weights. A trainer killed between the two leaves directories of pruned versions, which the next
one removes when it starts (`Trainer.start`, as it removes unregistered ones).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from clawrl.store.training import TrainingStore
from clawrl.versions.files import version_dir

log = logging.getLogger(__name__)


class VersionPruner:
    """Removes the directories of a run's versions that `--keep-versions` does not keep."""

    def __init__(self, training: TrainingStore, run_dir: Path, keep_steps: int, grace_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.training, self.run_dir, self.keep_steps, self.grace_s, self.clock = training, Path(run_dir), keep_steps, grace_s, clock
        self._unkept_since: dict[str, dict[int, float]] = {}  # per lineage: version -> when first seen unkept

    def prune(self, lineage: str) -> list[int]:
        """Remove the weights of the lineage's versions that have been unkept for `grace_s`; the versions removed."""
        now = self.clock()
        seen = self._unkept_since.get(lineage, {})
        # a version kept again (pinned, rolled back to) drops out here, and waits anew if it leaves again
        since = {version: seen.get(version, now) for version in self.training.unkept_versions(lineage, self.keep_steps)}
        due = [version for version, first in since.items() if now - first >= self.grace_s]
        pruned = self.training.mark_pruned(lineage, due, self.keep_steps) if due else []
        for version in pruned:
            since.pop(version)
            shutil.rmtree(version_dir(self.run_dir, lineage, version), ignore_errors=True)
        self._unkept_since[lineage] = since
        if pruned:
            log.info("removed the weights of %d version(s) of %s (--keep-versions %d): v%s", len(pruned), lineage,
                     self.keep_steps, ", v".join(map(str, pruned)))  # fmt: skip
        return pruned
