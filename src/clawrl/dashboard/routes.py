"""The dashboard's routes: mounted under `/dashboard` by `clawrl serve`, or served alone by `clawrl dashboard`.

Every page is a few store reads, run in a worker thread so that serving's event loop never waits
on them. The pages show users' conversations, so when an API key is configured they need it too:
as `Authorization: Bearer <key>` (scripts) or as the password of HTTP Basic authentication, which
is what a browser asks for (any user name). The admin key (and anyone, on a run with neither an
admin key nor users) sees every user's records; a user's key (`clawrl users add`) sees that user's
own: their sessions, counts and live score, and their own lineage's versions. Another user's
session is "not recorded", exactly as a missing one, so that ids tell nothing.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from clawrl.dashboard.pages import render_not_found, render_overview, render_session
from clawrl.dashboard.views import overview, session_page
from clawrl.errors import APIError, install_error_handlers
from clawrl.store import Store

BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="clawrl dashboard", charset="UTF-8"'}


# Who is looking, from the request's key as `Authorization: Bearer <key>`: None for one who sees
# every user's records, else the user id; APIError 401 for a key that is nobody's (`KeyChecker.viewer`).
Viewer = Callable[[Mapping[str, str]], Awaitable[str | None]]
NOT_RECORDED = "No session '{}' is recorded."


def given_key(authorization: str) -> str | None:
    """The key an Authorization header carries, as a bearer token or a Basic password (None: neither)."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip() or None
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(credentials.strip(), validate=True).decode("utf-8").partition(":")[2] or None
        except ValueError:  # not base64 (binascii.Error; a non-ASCII byte is a plain ValueError), or not UTF-8
            return None
    return None


def dashboard_router(store: Store, viewer: Viewer, title: str) -> APIRouter:
    """`/dashboard` (overview, `?refresh=S` reloads every S seconds, 0 never), `/dashboard/sessions/{id}`
    and `/dashboard/api/overview` (the overview as JSON)."""
    router = APIRouter(prefix="/dashboard")

    async def looking(request: Request) -> str | None:
        key = given_key(request.headers.get("authorization", ""))
        try:
            return await viewer({"authorization": f"Bearer {key}"} if key else {})
        except APIError:
            raise APIError(401, "The dashboard needs an API key (the admin's, or a user's for their own records): as a "
                           "Bearer token, or as the password of HTTP Basic authentication (any user name).",
                           "invalid_api_key", headers=BASIC_CHALLENGE) from None

    @router.get("", response_class=HTMLResponse)
    async def overview_page(request: Request, refresh: float = Query(10.0, ge=0, le=3600)) -> HTMLResponse:
        user_id = await looking(request)
        # reading and rendering both run off the event loop: serving shares it
        return HTMLResponse(await asyncio.to_thread(lambda: render_overview(overview(store, user_id), refresh, title)))

    @router.get("/api/overview")
    async def overview_json(request: Request) -> JSONResponse:
        user_id = await looking(request)
        return JSONResponse(await asyncio.to_thread(overview, store, user_id))

    @router.get("/sessions/{session_id:path}", response_class=HTMLResponse)
    async def session(request: Request, session_id: str) -> HTMLResponse:
        user_id = await looking(request)
        page = await asyncio.to_thread(_session_html, store, session_id, user_id, title)
        if page is None:
            return HTMLResponse(render_not_found(NOT_RECORDED.format(session_id), title), status_code=404)
        return HTMLResponse(page)

    return router


def _session_html(store: Store, session_id: str, user_id: str | None, title: str) -> str | None:
    """The session's page, or None when it is not recorded or (for a user) not theirs."""
    session = store.turns.session(session_id)
    if session is None or (user_id is not None and session.user_id != user_id):
        return None
    data = session_page(store, session_id)
    return None if data is None else render_session(data, title)


def add_dashboard(app: FastAPI, store: Store, viewer: Viewer, title: str) -> None:
    """Mount the dashboard on `app`, and send a browser that opens the bare address there."""
    app.include_router(dashboard_router(store, viewer, title))

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")


def create_dashboard_app(store: Store, viewer: Viewer, title: str) -> FastAPI:
    """The dashboard alone, over any store (`clawrl dashboard`): no model, no serving."""
    app = FastAPI(title="clawrl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    add_dashboard(app, store, viewer, title)
    return app
