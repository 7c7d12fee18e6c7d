"""Schema versioning: create a fresh store, or upgrade an older one step by step.

Each entry of `MIGRATIONS` upgrades from version N-1 to N; new tables that later issues add are
created by `create_all` (which never touches existing tables), column changes go here.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, Engine, inspect, select, text, update

from clawrl.store.queues import backfill
from clawrl.store.schema import EMPTY_ANSWER, Base, EpisodeRow, Meta, PolicyPointerRow, unsampled_step
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE

SCHEMA_VERSION = 15
MIGRATION_LOCK_KEY = 0x636C6177726C  # "clawrl": the PostgreSQL advisory lock migrations hold


def _judging_tables(_connection: Connection) -> None:
    """v2 adds `judgments` and `judge_leases`: new tables only, which `create_all` has made."""


def _training_tables(_connection: Connection) -> None:
    """v3 adds `samples`, `policy_versions` and `policy_pointers`: new tables only, which `create_all` has made."""


def _episode_table(_connection: Connection) -> None:
    """v4 adds `episodes`: a new table only, which `create_all` has made."""


def _work_queues(connection: Connection) -> None:
    """v5 adds `judge_queue` and `sample_queue` (which `create_all` has made) and queues the
    turns still waiting for a verdict or a sample."""
    backfill(connection)


def _lineages(connection: Connection) -> None:
    """v6 names the lineage of every version and pointer: what existed is the shared lineage. The
    pointers' key grows a column, which no backend adds in place: the (few) rows are read, the
    table is made again, and they go back in. A table `create_all` has just made is new already."""
    if "lineage" not in _columns(connection, "policy_versions"):
        connection.execute(text(f"ALTER TABLE policy_versions ADD COLUMN lineage VARCHAR(64) NOT NULL DEFAULT '{SHARED_LINEAGE}'"))
        connection.execute(text("CREATE INDEX ix_policy_versions_lineage ON policy_versions (lineage)"))
    if "lineage" not in _columns(connection, "policy_pointers"):
        pointers = connection.execute(text("SELECT name, version, reason, updated_at FROM policy_pointers")).mappings().all()
        connection.execute(text("DROP TABLE policy_pointers"))
        PolicyPointerRow.__table__.create(connection)
        if pointers:
            connection.execute(PolicyPointerRow.__table__.insert(), [{**pointer, "lineage": SHARED_LINEAGE} for pointer in pointers])


def _empty_answers_index(connection: Connection) -> None:
    """v7 indexes the recent empty answers (`schema.EMPTY_ANSWER`), which were found by scanning every
    turn of the last ten minutes on each new session's first request."""
    connection.execute(text(f"CREATE INDEX IF NOT EXISTS ix_turns_empty_answers ON turns (created_at) WHERE {EMPTY_ANSWER}"))


def _session_owners(connection: Connection) -> None:
    """v8 adds `users` (which `create_all` has made) and names the user of every session: what existed
    is the default user's."""
    if "user_id" not in _columns(connection, "sessions"):
        connection.execute(text(f"ALTER TABLE sessions ADD COLUMN user_id VARCHAR(64) NOT NULL DEFAULT '{DEFAULT_USER}'"))
        connection.execute(text("CREATE INDEX ix_sessions_user_id ON sessions (user_id)"))


def _opt_outs(connection: Connection) -> None:
    """v9 records what opted out of training or recording (DESIGN §12): a turn's `opt_out`, a session's
    and a user's `train`, a user's `store`. Nothing stored before had opted out."""
    added = {
        "turns": ("opt_out VARCHAR(8)",),
        "sessions": ("train BOOLEAN NOT NULL DEFAULT TRUE",),
        "users": ("store BOOLEAN NOT NULL DEFAULT TRUE", "train BOOLEAN NOT NULL DEFAULT TRUE"),
    }
    for table, columns in added.items():
        present = _columns(connection, table)
        for column in columns:
            if column.split()[0] not in present:
                connection.execute(text(f"ALTER TABLE {table} ADD COLUMN {column}"))


def _retained_versions(connection: Connection) -> None:
    """v10 marks the versions whose weights `--keep-versions` removed (`pruned`) and those a person
    keeps for good (`pinned`: `clawrl versions pin`). Nothing stored before was either."""
    present = _columns(connection, "policy_versions")
    for column in ("pruned", "pinned"):
        if column not in present:
            connection.execute(text(f"ALTER TABLE policy_versions ADD COLUMN {column} BOOLEAN NOT NULL DEFAULT FALSE"))


def _memory_notes(connection: Connection) -> None:
    """v11 adds `memory_notes` (which `create_all` has made) and records on a turn which notes its prompt
    held (`memory_note_ids`): no turn stored before held any."""
    if "memory_note_ids" not in _columns(connection, "turns"):
        connection.execute(text("ALTER TABLE turns ADD COLUMN memory_note_ids JSON"))


def _memory_training(connection: Connection) -> None:
    """v12 records the prompt a sample's student is trained under when it is not the turn's
    (`samples.student_prompt_token_ids`) and when a note was retired (`memory_notes.retired_at`):
    nothing stored before had either."""
    if "student_prompt_token_ids" not in _columns(connection, "samples"):
        connection.execute(text("ALTER TABLE samples ADD COLUMN student_prompt_token_ids JSON"))
    if "retired_at" not in _columns(connection, "memory_notes"):
        connection.execute(text("ALTER TABLE memory_notes ADD COLUMN retired_at FLOAT"))


def _sampled_episodes(connection: Connection) -> None:
    """v13 marks the episodes that have ended with a sample for every main turn (`episodes.sampled`),
    which the trainer's poll had looked for among all episodes each time, and indexes the others."""
    if "sampled" not in _columns(connection, "episodes"):
        connection.execute(text("ALTER TABLE episodes ADD COLUMN sampled BOOLEAN NOT NULL DEFAULT FALSE"))
    connection.execute(text("CREATE INDEX IF NOT EXISTS ix_episodes_waiting ON episodes (sampled, group_id)"))
    episodes = EpisodeRow.__table__
    connection.execute(update(episodes).where(episodes.c.status != "running", ~unsampled_step()).values(sampled=True))


def _sessions_by_user_recency(connection: Connection) -> None:
    """v14 indexes a user's sessions by recency (`ix_sessions_user_recent`) in place of by user alone:
    a user's most recent sessions had been read by sorting all of theirs."""
    connection.execute(text("DROP INDEX IF EXISTS ix_sessions_user_id"))
    connection.execute(text("CREATE INDEX IF NOT EXISTS ix_sessions_user_recent ON sessions (user_id, updated_at)"))


def _judging_workers(connection: Connection) -> None:
    """v15 records the judge worker that wrote each verdict (`judgments.worker_id`): with judges on
    many machines (Ray actors, `clawrl judge` processes) it tells which one judged a turn; verdicts
    stored before keep none."""
    if "worker_id" not in _columns(connection, "judgments"):
        connection.execute(text("ALTER TABLE judgments ADD COLUMN worker_id VARCHAR(64)"))


def _columns(connection: Connection, table: str) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns(table)}


MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    2: _judging_tables,
    3: _training_tables,
    4: _episode_table,
    5: _work_queues,
    6: _lineages,
    7: _empty_answers_index,
    8: _session_owners,
    9: _opt_outs,
    10: _retained_versions,
    11: _memory_notes,
    12: _memory_training,
    13: _sampled_episodes,
    14: _sessions_by_user_recency,
    15: _judging_workers,
}


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer clawrl; refusing to touch it."""


def migrate(engine: Engine) -> int:
    """Bring the database to SCHEMA_VERSION and return the version it was at before.

    Runs as a write transaction from the start (BEGIN IMMEDIATE on SQLite): other processes may be
    writing to the same store while this one opens it.
    """
    with engine.execution_options(clawrl_write=True).begin() as connection:
        if connection.dialect.name == "postgresql":
            # Serving and its trainer open a new store at the same moment; concurrent CREATE TABLEs
            # collide in PostgreSQL's catalog, so migrations take turns (released at commit).
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        # the version is read before anything is created: a newer clawrl's database is left as it is
        row = None
        if inspect(connection).has_table(Meta.__tablename__):
            row = connection.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar()
        found = int(row) if row is not None else SCHEMA_VERSION
        if found > SCHEMA_VERSION:
            raise SchemaTooNewError(f"database schema v{found} is newer than this clawrl (v{SCHEMA_VERSION})")
        Base.metadata.create_all(connection)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[version](connection)
        if row is None or found != SCHEMA_VERSION:
            connection.execute(Meta.__table__.delete().where(Meta.key == "schema_version"))
            connection.execute(Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
    return found
