"""Which policy versions keep their weights on disk (`--keep-versions K`, DESIGN §12 retention).

Every published version leaves a directory (weights, optimizer state, manifest): a trainer that
steps every few seconds fills a disk. With `--keep-versions K` the trainer removes the directories
of the versions nobody can need, and the rows stay, marked `pruned`, so the lineage's history
(parents, metrics, which samples trained what) still reads whole. Kept, per lineage:

- the serving version: serving answers with it and the trainer trains on from it;
- the pinned ones (`clawrl versions pin`): the ones a person wants to be able to go back to;
- the parents of each of those, back K steps: what a rollback after a bad step goes back to;
- the newest: right after a rollback it is the version serving was answering with a moment ago.

A version pinned or rolled back to must still have its weights, and a version about to be pruned
must not be pinned or served meanwhile: pruning, pinning and rollback each lock the lineage's
serving pointer first (`serving_pointer(lock=True)`), so on a server database they take turns as SQLite's
writers always do, and each decides on what the one before it committed.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from clawrl.store.schema import PolicyPointerRow, PolicyVersionRow

SERVING = "serving"  # the pointer serving follows and the trainer trains from


class VersionPrunedError(LookupError):
    """A version whose weights `--keep-versions` removed: it can be neither served nor pinned again."""


def serving_pointer(db: Session, lineage: str, lock: bool = False) -> int:
    """The lineage's serving version (0: the base model); with `lock`, the pointer row stays locked
    until the transaction ends, so that on a server database a rollback, a publish, a pin and a
    prune of one lineage cannot interleave (SQLite's writers take turns anyway)."""
    row = db.get(PolicyPointerRow, (lineage, SERVING), with_for_update=lock)
    return row.version if row is not None else 0


def kept_versions(rows: list[PolicyVersionRow], serving: int, keep_steps: int) -> set[int]:
    """Of a lineage's version rows, those whose weights stay (the module's rules)."""
    parents = {row.version: row.parent for row in rows}
    kept = {max(parents)} if parents else set()
    for anchor in {serving, *(row.version for row in rows if row.pinned)}:
        version = anchor
        for _ in range(keep_steps + 1):  # the anchor, then K parents (0, the base, has no row)
            if version not in parents:
                break
            kept.add(version)
            version = parents[version]
    return kept


def unkept(db: Session, lineage: str, keep_steps: int, lock: bool = False) -> list[int]:
    """The lineage's versions that still have their weights and need not, oldest first."""
    rows = list(db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.lineage == lineage)))
    serving = serving_pointer(db, lineage, lock)
    kept = kept_versions(rows, serving, keep_steps)
    return sorted(row.version for row in rows if not row.pruned and row.version not in kept)


def mark_pruned(db: Session, lineage: str, versions: list[int], keep_steps: int) -> list[int]:
    """Mark those of `versions` that are still not kept as pruned, deciding under the pointer's lock."""
    chosen = sorted(set(versions) & set(unkept(db, lineage, keep_steps, lock=True)))
    if chosen:
        db.execute(update(PolicyVersionRow).where(PolicyVersionRow.version.in_(chosen)).values(pruned=True)
                   .execution_options(synchronize_session=False))  # fmt: skip
    return chosen

