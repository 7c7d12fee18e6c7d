"""`GET /v1/sessions` and `GET /v1/sessions/{id}`: a caller reads their own records.

A user's key lists and reads that user's sessions only; another user's session is a 404, the
answer for one that does not exist, so that ids tell nothing. The admin's key reaches everyone's.
A session's page is its whole record (the same view the dashboard renders), so reading it is also
how a user exports a conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Query, Request

from clawrl.dashboard.views import session_page, session_summary
from clawrl.errors import APIError
from clawrl.serve import openapi
from clawrl.serve.auth import Caller, reaches, scoped_session_id
from clawrl.store import Store

MAX_LISTED = 1000


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
