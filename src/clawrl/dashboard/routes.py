"""The dashboard's routes: mounted under `/dashboard` by `clawrl serve`, or served alone by `clawrl dashboard`.

Every page is a few store reads, run in a worker thread so that serving's event loop never waits
on them. The pages show users' conversations, so when an API key is configured they need it too:
as `Authorization: Bearer <key>` (scripts) or as the password of HTTP Basic authentication, which
is what a browser asks for (any user name). They show every user's, so a run with users (`clawrl
users`) shows them to the admin key only; a user's own pages are not built yet.
"""

from __future__ import annotations

import asyncio
import base64
import hmac

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from clawrl.dashboard.pages import render_not_found, render_overview, render_session
from clawrl.dashboard.views import overview, session_page
from clawrl.errors import APIError, install_error_handlers
from clawrl.store import Store

BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="clawrl dashboard", charset="UTF-8"'}


def key_matches(authorization: str, api_key: str) -> bool:
    """Whether an Authorization header carries `api_key`, as a bearer token or a Basic password."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer":
        given = credentials.strip()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(credentials.strip(), validate=True).decode("utf-8").partition(":")[2]
        except ValueError:  # not base64 (binascii.Error; a non-ASCII byte is a plain ValueError), or not UTF-8
            return False
    else:
        return False
    return hmac.compare_digest(given.encode(), api_key.encode())


def dashboard_router(store: Store, api_key: str | None, title: str) -> APIRouter:
    """`/dashboard` (overview, `?refresh=S` reloads every S seconds, 0 never), `/dashboard/sessions/{id}`
    and `/dashboard/api/overview` (the overview as JSON)."""
    router = APIRouter(prefix="/dashboard")

    async def authorize(request: Request) -> None:
        if api_key is not None and not key_matches(request.headers.get("authorization", ""), api_key):
            raise APIError(401, "The dashboard needs the API key: as a Bearer token, or as the password of HTTP Basic "
                           "authentication (any user name).", "invalid_api_key", headers=BASIC_CHALLENGE)
        # every user's conversations are on these pages: once a run has users they are the admin's alone
        if api_key is None and await asyncio.to_thread(store.users.list):
            raise APIError(401, "This run has users, so the dashboard is the admin's: start it with --api-key and "
                           "give that key.", "invalid_api_key", headers=BASIC_CHALLENGE)

    @router.get("", response_class=HTMLResponse)
    async def overview_page(request: Request, refresh: float = Query(10.0, ge=0, le=3600)) -> HTMLResponse:
        await authorize(request)
        # reading and rendering both run off the event loop: serving shares it
        return HTMLResponse(await asyncio.to_thread(lambda: render_overview(overview(store), refresh, title)))

    @router.get("/api/overview")
    async def overview_json(request: Request) -> JSONResponse:
        await authorize(request)
        return JSONResponse(await asyncio.to_thread(overview, store))

    @router.get("/sessions/{session_id:path}", response_class=HTMLResponse)
    async def session(request: Request, session_id: str) -> HTMLResponse:
        await authorize(request)
        page = await asyncio.to_thread(_session_html, store, session_id, title)
        if page is None:
            return HTMLResponse(render_not_found(f"No session '{session_id}' is recorded.", title), status_code=404)
        return HTMLResponse(page)

    return router


def _session_html(store: Store, session_id: str, title: str) -> str | None:
    data = session_page(store, session_id)
    return None if data is None else render_session(data, title)


def add_dashboard(app: FastAPI, store: Store, api_key: str | None, title: str) -> None:
    """Mount the dashboard on `app`, and send a browser that opens the bare address there."""
    app.include_router(dashboard_router(store, api_key, title))

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")


def create_dashboard_app(store: Store, api_key: str | None, title: str) -> FastAPI:
    """The dashboard alone, over any store (`clawrl dashboard`): no model, no serving."""
    app = FastAPI(title="clawrl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    add_dashboard(app, store, api_key, title)
    return app
