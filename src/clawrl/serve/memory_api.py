"""`GET` and `POST /v1/me/memory`, `PATCH` and `DELETE /v1/me/memory/{id}`: a caller sees, adds, edits and
removes their own memory notes (all of them go with the rest of their records: `DELETE /v1/me/data`).

The notes are the caller's, by their key: a user's key reaches only theirs (another user's note id is
a 404, as one that does not exist), and the admin's key, or no key on a server without one, reaches
the notes of the records made without a user's key (`DEFAULT_USER`): the notes its own prompts
carry. That is unlike `/v1/me/data`, which the admin has none of: a run with no users has one set of
notes, the run's, and whoever runs it must be able to see and correct it. The notes can be kept and
edited while `--memory` is off; they are only said in prompts while it is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request

from clawrl.config import ServeConfig
from clawrl.errors import APIError
from clawrl.serve import openapi, schemas
from clawrl.serve.auth import Caller
from clawrl.serve.bodies import read_json
from clawrl.serve.episodes import parse_body
from clawrl.store import Store
from clawrl.store.memory import NoSuchNote, NoteError, SameNote
from clawrl.types import MemoryNote

MAX_ID_DIGITS = 18  # a note id fits a 64-bit integer column


def note_view(note: MemoryNote) -> dict[str, Any]:
    """A note as the API and `clawrl memory list --json` show it; `retired_at` is set once the weights
    follow it unprompted (`--memory-retire`: no longer injected), null while it is active."""
    return {"id": note.id, "object": "memory.note", "text": note.text, "source": note.source, "turn_id": note.turn_id,
            "created_at": note.created_at, "updated_at": note.updated_at, "retired_at": note.retired_at}  # fmt: skip


def add_routes(app: FastAPI, store: Store, authorize: Callable[[Request], Awaitable[Caller]], config: ServeConfig) -> None:
    @app.get("/v1/me/memory", **openapi.ME_MEMORY)
    async def list_notes(request: Request) -> dict[str, Any]:
        caller = await authorize(request)
        notes = await asyncio.to_thread(store.memory.notes, caller.user_id)
        return {"object": "list", "memory": config.memory, "limit": config.memory_notes,
                "data": [note_view(note) for note in notes]}  # fmt: skip

    @app.post("/v1/me/memory", **openapi.ME_MEMORY_ADD)
    async def add_note(request: Request) -> dict[str, Any]:
        caller = await authorize(request)
        item = parse_body(schemas.MemoryNoteRequest, await read_json(request, config.max_body_bytes))
        try:
            note = await asyncio.to_thread(store.memory.remember, caller.user_id, item.text, "user", config.memory_notes)
        except NoteError as error:
            raise APIError(400, f"{error}.", "invalid_value", "text") from None
        return note_view(note)

    @app.patch("/v1/me/memory/{note_id}", **openapi.ME_MEMORY_EDIT)
    async def edit_note(request: Request, note_id: str) -> dict[str, Any]:
        caller = await authorize(request)
        number = _note_number(note_id)
        item = parse_body(schemas.MemoryNoteRequest, await read_json(request, config.max_body_bytes))
        try:
            note = await asyncio.to_thread(store.memory.edit, caller.user_id, number, item.text)
        except NoSuchNote:
            raise APIError(404, f"You have no note {number}.", "note_not_found", "note_id") from None
        except SameNote as error:
            raise APIError(409, f"{error}; remove one of them instead.", "note_exists", "text") from None
        except NoteError as error:
            raise APIError(400, f"{error}.", "invalid_value", "text") from None
        return note_view(note)

    @app.delete("/v1/me/memory/{note_id}", **openapi.ME_MEMORY_REMOVE)
    async def remove_note(request: Request, note_id: str) -> dict[str, Any]:
        caller = await authorize(request)
        number = _note_number(note_id)
        try:
            await asyncio.to_thread(store.memory.remove, caller.user_id, number)
        except NoSuchNote:
            raise APIError(404, f"You have no note {number}.", "note_not_found", "note_id") from None
        return {"id": number, "object": "memory.note.deleted", "deleted": True}


def _note_number(note_id: str) -> int:
    """A path's note id as a number, or a 400 (a word, or more digits than an id column holds: never a 500)."""
    if not (note_id.isascii() and note_id.isdigit() and len(note_id) <= MAX_ID_DIGITS):
        raise APIError(400, f"A note's id is a number; '{note_id}' is not.", "invalid_value", "note_id")
    return int(note_id)
