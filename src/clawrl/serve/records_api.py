"""`GET /v1/sessions`, `GET /v1/sessions/{id}`, `GET` and `DELETE /v1/me/data`: a caller reads, or erases, their own records.

A user's key lists and reads that user's sessions only; another user's session is a 404, the
answer for one that does not exist, so that ids tell nothing. The admin's key reaches everyone's.
A session's page is its whole record (the same view the dashboard renders, with each turn's
opt-out), so reading it is also how a user exports a conversation. `GET /v1/me/data` is all of
the caller's records at once, as the JSON lines of `clawrl export` (`store.inspect.export_lines`):
a user's key only (the admin is not a user with records of their own: `clawrl export` is theirs,
or `clawrl users export NAME`). `DELETE /v1/me/data` forgets the caller (`versions/forgetting.py`):
every record and their lineage go, the account and key stay, so that a client can erase what it
said without an admin; removing the account is the admin's (`clawrl users forget NAME`).
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
from clawrl.serve.auth import NO_KEY, Caller, reaches, scoped_session_id
from clawrl.store import Store
from clawrl.store.inspect import export_lines
from clawrl.store.users import UserError
from clawrl.versions.follower import PolicyFollower
from clawrl.versions.forgetting import forget_user

MAX_LISTED = 1000
ADMIN_HAS_NO_DATA = ("The admin's key has no records of its own to export: run `clawrl export` for everyone's, or "
                     "`clawrl users export NAME` for one user's, or call with that user's key.")
ADMIN_FORGETS_NOBODY = ("The admin's key has no records of its own to forget: run `clawrl users forget NAME --yes` "
                        "to forget a user (their account too), or call with that user's key (their account stays).")


def add_routes(app: FastAPI, store: Store, authorize: Callable[[Request], Awaitable[Caller]], policy: PolicyFollower) -> None:
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

    @app.delete("/v1/me/data", **openapi.ME_DATA_DELETE)
    async def forget_my_data(request: Request) -> dict[str, Any]:
        caller = await authorize(request)
        if caller.admin:
            raise APIError(400, ADMIN_FORGETS_NOBODY, "admin_has_no_data")
        try:
            report = await asyncio.to_thread(forget_user, store, caller.user_id, False)
        except UserError:  # removed by `clawrl users remove` since the key was checked, with nothing stored
            raise APIError(401, NO_KEY, "invalid_api_key") from None
        await policy.drop(caller.user_id)  # at once, not at the next poll: no request of theirs gets the old adapter
        return {"object": "user.data.deleted", "deleted": True, **report.as_json()}


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
