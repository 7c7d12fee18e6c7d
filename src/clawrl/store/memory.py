"""Memory notes in the store (`store.memory`, DESIGN §13): what each user taught, kept to be said again.

A user keeps at most `limit` notes (`--memory-notes`): a note taught again is not kept twice (its
normalised text is compared) but becomes the newest, and past the limit the notes taught longest
ago go. A user has a handful of notes, so they are read whole and compared after decryption
(`schema.MemoryNoteRow` says why no hash of the text is kept). Notes are injected oldest first
(`injected`): a new note then lengthens the end of the block and leaves what came before it as it
was.

A note the weights have learnt is retired (`retire`, `--memory-retire`: `serve/retirement.py`): it
stays in the record (listed, exported, forgotten with its user) but is no longer injected, and the
limit counts active notes only. Taught again, or edited by its user, it is active again.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Iterable

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session as DBSession

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.schema import MemoryNoteRow, SessionRow, TurnRow
from clawrl.types import MemoryNote, MemoryNoteSource, Turn

NOTED_TURNS_SCANNED = 512  # `noted_turns` reads at most this many of a user's newest noted turns
MAX_NOTE_CHARS = 1000  # a note is a sentence or three (a hint is 1-3); longer text is no note but a document
_TRAILING = " .!;,"


class NoteError(ValueError):
    """A note that cannot be kept or found, with a message for the person who asked."""


class NoSuchNote(NoteError):
    """The user has no note with that id (another user's is not theirs to see)."""


class SameNote(NoteError):
    """An edit would make a note say what another of the user's notes says already."""


def normalised(text: str) -> str:
    """What two notes are compared by: case, spacing, Unicode form and closing punctuation aside
    ("Use fewer words." and "use fewer  words" are one note)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(_TRAILING)


def checked_text(text: str) -> str:
    """`text` as a note keeps it (trimmed), or a NoteError saying why it cannot be one."""
    kept = text.strip()
    if not normalised(kept):
        raise NoteError("a note needs some text")
    if len(kept) > MAX_NOTE_CHARS:
        raise NoteError(f"a note is at most {MAX_NOTE_CHARS} characters; this one has {len(kept)}")
    return kept


class MemoryStore:
    """Users' memory notes (`store.memory`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def remember(self, user_id: str, text: str, source: MemoryNoteSource, limit: int,
                 turn_id: str | None = None) -> MemoryNote:  # fmt: skip
        """Keep `text` as the newest of `user_id`'s notes (the same note taught again is refreshed, not
        repeated, and active again if it was retired), then drop their oldest active ones past
        `limit`. A NoteError for text that is no note."""
        kept = checked_text(text)
        now = time.time()
        with self.database.write() as db:
            row = self._same_note(db, user_id, kept)
            if row is None:
                row = MemoryNoteRow(user_id=user_id, text=kept, source=source, turn_id=turn_id, created_at=now, updated_at=now)
                db.add(row)
            else:
                row.updated_at, row.retired_at = now, None
            db.flush()
            self._keep_newest(db, user_id, limit)
            return records.memory_note(row)

    def remember_for_turn(self, turn_id: str, text: str, source: MemoryNoteSource, limit: int) -> MemoryNote | None:
        """A note taught on `turn_id` (its hint, its feedback), kept for the turn's user; None if the turn
        is gone or the text is no note (a judge's hint or a feedback is never refused for it)."""
        with self.database.read() as db:
            user_id = db.scalar(select(SessionRow.user_id).join(TurnRow, TurnRow.session_id == SessionRow.id)
                                .where(TurnRow.id == turn_id))  # fmt: skip
        if user_id is None:
            return None
        try:
            return self.remember(user_id, text, source, limit, turn_id)
        except NoteError:
            return None

    def notes(self, user_id: str) -> list[MemoryNote]:
        """Every note of `user_id`'s, retired ones included, oldest first (the order they are injected in)."""
        with self.database.read() as db:
            rows = db.scalars(select(MemoryNoteRow).where(MemoryNoteRow.user_id == user_id).order_by(MemoryNoteRow.id))
            return [records.memory_note(row) for row in rows]

    def injected(self, user_id: str, limit: int) -> list[MemoryNote]:
        """The notes a prompt of `user_id`'s holds: the newest `limit` active ones (a store written with a
        larger `--memory-notes` may hold more), oldest first; a retired note never is."""
        active = [note for note in self.notes(user_id) if note.retired_at is None]
        newest = sorted(active, key=lambda note: (note.updated_at, note.id))[-limit:]
        return sorted(newest, key=lambda note: note.id)

    def edit(self, user_id: str, note_id: int, text: str) -> MemoryNote:
        """Say one of `user_id`'s notes in their words: it keeps its id and place in the block and is
        theirs (`source` "user") and the newest, and active (they said it again). NoSuchNote for an id of none of theirs; SameNote when
        another of their notes says it already (remove one of them instead)."""
        kept = checked_text(text)
        with self.database.write() as db:
            row = db.get(MemoryNoteRow, note_id)
            if row is None or row.user_id != user_id:
                raise NoSuchNote(f"there is no note {note_id} of {user_id}'s")
            same = self._same_note(db, user_id, kept)
            if same is not None and same.id != note_id:
                raise SameNote(f"note {same.id} of {user_id}'s says that already")
            row.text, row.source, row.updated_at, row.retired_at = kept, "user", time.time(), None
            return records.memory_note(row)

    def retire(self, user_id: str, note_id: int) -> MemoryNote:
        """Stop injecting one of `user_id`'s notes (the weights follow it unprompted): it stays in the
        record until removed or forgotten. NoSuchNote for an id of none of theirs."""
        with self.database.write() as db:
            row = db.get(MemoryNoteRow, note_id)
            if row is None or row.user_id != user_id:
                raise NoSuchNote(f"there is no note {note_id} of {user_id}'s")
            if row.retired_at is None:
                row.retired_at = time.time()
            return records.memory_note(row)

    def users_with_active_notes(self) -> list[str]:
        """The users whose prompts carry a note (with --memory on), by name."""
        with self.database.read() as db:
            statement = select(MemoryNoteRow.user_id).where(MemoryNoteRow.retired_at.is_(None)).distinct()
            return sorted(db.scalars(statement))

    def counts(self) -> dict[str, int]:
        """Everyone's notes by state: {"active": ..., "retired": ...} (`/metrics`)."""
        retired = MemoryNoteRow.retired_at.is_not(None)
        with self.database.read() as db:
            rows = db.execute(select(retired, func.count()).group_by(retired)).all()
        counted = {bool(is_retired): count for is_retired, count in rows}
        return {"active": counted.get(False, 0), "retired": counted.get(True, 0)}

    def noted_turns(self, user_id: str, note_ids: Iterable[int], per_note: int,
                    opening: bool = False) -> dict[int, list[Turn]]:  # fmt: skip
        """For each of `note_ids`, the newest `per_note` main turns of `user_id`'s whose prompt carried
        it and that have an answer, newest first: of their newest `NOTED_TURNS_SCANNED` noted turns.
        `opening`: only turns that open a conversation (no assistant message before them)."""
        wanted: dict[int, list[Turn]] = {note_id: [] for note_id in note_ids}
        query = (select(TurnRow).join(SessionRow, SessionRow.id == TurnRow.session_id)
                 .where(SessionRow.user_id == user_id, TurnRow.kind == "main", TurnRow.memory_note_ids.is_not(None))
                 .order_by(TurnRow.created_at.desc(), TurnRow.id.desc()))  # fmt: skip
        batch = 32
        for offset in range(0, NOTED_TURNS_SCANNED, batch):
            if all(len(turns) >= per_note for turns in wanted.values()):
                break
            with self.database.read() as db:
                rows = list(db.scalars(query.offset(offset).limit(batch)))
                found = [records.turn(row) for row in rows]
            for turn in found:
                for note_id in turn.memory_note_ids or []:
                    if note_id in wanted and len(wanted[note_id]) < per_note and turn.response_token_ids and (
                            not opening or all(message["role"] != "assistant" for message in turn.messages)):
                        wanted[note_id].append(turn)
            if len(rows) < batch:
                break
        return wanted

    def remove(self, user_id: str, note_id: int) -> None:
        """Remove one of `user_id`'s notes; NoSuchNote if they have none with that id (another user's
        is not found either)."""
        with self.database.write() as db:
            statement = delete(MemoryNoteRow).where(MemoryNoteRow.id == note_id, MemoryNoteRow.user_id == user_id)
            if db.execute(statement).rowcount == 0:
                raise NoSuchNote(f"there is no note {note_id} of {user_id}'s")

    def _same_note(self, db: DBSession, user_id: str, text: str) -> MemoryNoteRow | None:
        wanted = normalised(text)
        rows = db.scalars(select(MemoryNoteRow).where(MemoryNoteRow.user_id == user_id).with_for_update())
        return next((row for row in rows if normalised(row.text) == wanted), None)

    def _keep_newest(self, db: DBSession, user_id: str, limit: int) -> None:
        """Drop the user's active notes past the newest `limit`; retired notes are kept, in no count."""
        active = (MemoryNoteRow.user_id == user_id, MemoryNoteRow.retired_at.is_(None))
        newest = (select(MemoryNoteRow.id).where(*active)
                  .order_by(MemoryNoteRow.updated_at.desc(), MemoryNoteRow.id.desc()).limit(limit))  # fmt: skip
        kept = list(db.scalars(newest))
        db.execute(delete(MemoryNoteRow).where(*active, MemoryNoteRow.id.not_in(kept)))


def active_over_time(notes: Iterable[MemoryNote]) -> list[tuple[float, int]]:
    """How many of `notes` were active from each moment on: (time, count) at every change, oldest
    first, from when each was first taught (`created_at`) to its retirement (`retired_at`). Of the notes
    still stored: a removed note, or one dropped past the limit, is in no count, and a note re-taught
    after its retirement counts from its first teaching on."""
    changes: list[tuple[float, int]] = []
    for note in notes:
        changes.append((note.created_at, 1))
        if note.retired_at is not None:
            changes.append((note.retired_at, -1))
    points: list[tuple[float, int]] = []
    active = 0
    for moment, change in sorted(changes):
        active += change
        if points and points[-1][0] == moment:
            points[-1] = (moment, active)
        else:
            points.append((moment, active))
    return points
