"""Loop 4, the swap: a policy version from the moment it is written to the moment serving answers with it.

- `files.py`: a version's directory (RUN_DIR/policy/LINEAGE/vN/): weights, trainer state and a
  manifest of sha256 digests, written atomically and verified before anyone loads it.
- publishing and the serving pointer are rows of the store (`store/training.py`
  `register_version`, `serving_target`, `rollback`): one transaction registers a version, marks its
  samples trained and moves its lineage's pointer.
- `follower.py`: serving polls its lineage's pointer and hands a verified version to its engine.
- `table.py`: the table of versions every engine keeps (current, in use, retired when unused).

Every version belongs to a lineage: today one, `shared`, trained on everyone's turns; with
per-user adapters (DESIGN §12) one per user. Version numbers are unique across lineages, so a
number alone names a version in an engine's table.

This package sits beside the store, below engines, train and serve: it imports neither.
"""
