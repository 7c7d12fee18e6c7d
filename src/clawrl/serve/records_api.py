"""`GET /v1/sessions`, `GET /v1/sessions/{id}` and `GET /v1/me/data`: a caller reads their own records.

A user's key lists and reads that user's sessions only; another user's session is a 404, the
answer for one that does not exist, so that ids tell nothing. The admin's key reaches everyone's.
A session's page is its whole record (the same view the dashboard renders, with each turn's
opt-out), so reading it is also how a user exports a conversation. `GET /v1/me/data` is all of
the caller's records at once, as the JSON lines of `clawrl export` (`store.inspect.export_lines`):
a user's key only (the admin is not a user with records of their own: `clawrl export` is theirs,
or `clawrl users export NAME`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from clawrl.dashboard.views import session_page, session_summary
from clawrl.errors import APIError
from clawrl.serve import openapi
from clawrl.serve.auth import Caller, reaches, scoped_session_id
from clawrl.store import Store
from clawrl.store.inspect import export_lines

MAX_LISTED = 1000
ADMIN_HAS_NO_DATA = ("The admin's key has no records of its own to export: run `clawrl export` for everyone's, or "
                     "`clawrl users export NAME` for one user's, or call with that user's key.")


def add_routes(app: FastAPI, store: Store, authorize: Callable[[Request], Awaitable[Caller]]) -> None:
    @app.get("/v1/sessions", **openapi.SESSIONS)
    async def list_sessions(request: Request, limit: int = Query(100, ge=1, le=MAX_LISTED)) -> dict[str, Any]:
        caller = await authorize(request)
        owner = None if caller.admin else caller.user_id
        sessions = await asyncio.to_thread(store.turns.list_sessions, limit, owner)
        return {"object": "list", "data": [session_summary(session) for session in sessions]}

    @app.get("/v1/sessions/{session_id:path}", **openapi.SESSION)
    async def read_session(request: Request, session_id: str) -> dict[str, Any]:
        caller = await authorize(request)
        page = await asyncio.to_thread(_own_session_page, store, caller, session_id)
        if page is None:
            raise APIError(404, f"No session '{session_id}' is recorded.", "session_not_found", "session_id")
        return page

    @app.get("/v1/me/data", **openapi.ME_DATA)
    async def export_my_data(request: Request) -> StreamingResponse:
        caller = await authorize(request)
        if caller.admin:
            raise APIError(400, ADMIN_HAS_NO_DATA, "admin_has_no_data")
        filename = f'attachment; filename="clawrl-{caller.user_id}.jsonl"'
        return StreamingResponse(export_lines(store, caller.user_id), media_type="application/x-ndjson",
                                 headers={"Content-Disposition": filename})  # fmt: skip


def _own_session_page(store: Store, caller: Caller, session_id: str) -> dict[str, Any] | None:
    """The page of the caller's session stored as `session_id`, or named so by them (`USER/NAME`)."""
    candidates = [session_id]
    try:
        candidates.append(scoped_session_id(caller.user_id, session_id))
    except APIError:  # too long to be a name of theirs: only the stored id can match
        pass
    for candidate in dict.fromkeys(candidates):
        if reaches(store.turns, caller, candidate):
            return session_page(store, candidate)
    return None


