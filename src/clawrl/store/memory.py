"""Memory notes in the store (`store.memory`, DESIGN §13): what each user taught, kept to be said again.

A user keeps at most `limit` notes (`--memory-notes`): a note taught again is not kept twice (its
normalised text is compared) but becomes the newest, and past the limit the notes taught longest
ago go. A user has a handful of notes, so they are read whole and compared after decryption
(`schema.MemoryNoteRow` says why no hash of the text is kept). Notes are injected oldest first
(`injected`): a new note then lengthens the end of the block and leaves what came before it as it
was.
"""

from __future__ import annotations

import time
import unicodedata

from sqlalchemy import delete, select
from sqlalchemy.orm import Session as DBSession

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.schema import MemoryNoteRow, SessionRow, TurnRow
from clawrl.types import MemoryNote, MemoryNoteSource

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
        repeated), then drop their oldest past `limit`. A NoteError for text that is no note."""
        kept = checked_text(text)
        now = time.time()
        with self.database.write() as db:
            row = self._same_note(db, user_id, kept)
            if row is None:
                row = MemoryNoteRow(user_id=user_id, text=kept, source=source, turn_id=turn_id, created_at=now, updated_at=now)
                db.add(row)
            else:
                row.updated_at = now
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
        """Every note of `user_id`'s, oldest first (the order they are injected in)."""
        with self.database.read() as db:
            rows = db.scalars(select(MemoryNoteRow).where(MemoryNoteRow.user_id == user_id).order_by(MemoryNoteRow.id))
            return [records.memory_note(row) for row in rows]

    def injected(self, user_id: str, limit: int) -> list[MemoryNote]:
        """The notes a prompt of `user_id`'s holds: the newest `limit` (a store written with a larger
        `--memory-notes` may hold more), oldest first."""
        newest = sorted(self.notes(user_id), key=lambda note: (note.updated_at, note.id))[-limit:]
        return sorted(newest, key=lambda note: note.id)

    def edit(self, user_id: str, note_id: int, text: str) -> MemoryNote:
        """Say one of `user_id`'s notes in their words: it keeps its id and place in the block and is
        theirs (`source` "user") and the newest. NoSuchNote for an id of none of theirs; SameNote when
        another of their notes says it already (remove one of them instead)."""
        kept = checked_text(text)
        with self.database.write() as db:
            row = db.get(MemoryNoteRow, note_id)
            if row is None or row.user_id != user_id:
                raise NoSuchNote(f"there is no note {note_id} of {user_id}'s")
            same = self._same_note(db, user_id, kept)
            if same is not None and same.id != note_id:
                raise SameNote(f"note {same.id} of {user_id}'s says that already")
            row.text, row.source, row.updated_at = kept, "user", time.time()
            return records.memory_note(row)

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
        newest = (select(MemoryNoteRow.id).where(MemoryNoteRow.user_id == user_id)
                  .order_by(MemoryNoteRow.updated_at.desc(), MemoryNoteRow.id.desc()).limit(limit))  # fmt: skip
        kept = list(db.scalars(newest))
        db.execute(delete(MemoryNoteRow).where(MemoryNoteRow.user_id == user_id, MemoryNoteRow.id.not_in(kept)))
