"""The FastAPI app: routes, authentication, body limits and background housekeeping.

Request bodies are read and parsed here rather than by FastAPI, so that size limits, malformed
JSON and schema errors all come back as OpenAI-style error objects with the right status; the
OpenAPI document still describes them (serve/openapi.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from clawrl.config import ServeConfig
from clawrl.dashboard.routes import add_dashboard
from clawrl.engines.base import Engine
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.judge.worker import JudgeWorker
from clawrl.serve import memory_api, messages_api, openapi, records_api, responses_api, schemas
from clawrl.serve.auth import Caller, KeyChecker, owned_session_id, reaches, scoped_session_id
from clawrl.serve.bodies import read_json
from clawrl.serve.completions import ChatService
from clawrl.serve.episodes import end_episode, parse_body, start_episode
from clawrl.errors import APIError, describe_validation_error, install_error_handlers
from clawrl.serve.metrics import JudgeFleet, ServeMetrics, timed_stream
from clawrl.serve.retirement import NoteRetirer
from clawrl.versions.follower import PolicyFollower
from clawrl.store import Store
from clawrl.store.retention import remove_older_than
from clawrl.trainer_process import TrainerProcess
from clawrl.types import AdaptersMode

log = logging.getLogger(__name__)


READY_STORE_TIMEOUT_S = 5.0  # /readyz waits this long for the store


def create_app(engine: Engine, store: Store, config: ServeConfig, judge: JudgeWorker | None = None,
               trainer: TrainerProcess | None = None, adapters: AdaptersMode = "shared",
               judges: JudgeFleet | None = None) -> FastAPI:
    """The app; with `judge`, the judge loop runs as a background task of this process. `trainer`
    and `judges` (the judge actors of `--judge-actors`; both started and stopped by the caller) are
    reported on /healthz and /metrics. `adapters`: whose lineage answers a request (the trainer's
    `--adapters`)."""
    served_name = config.served_model_name or engine.model_name
    metrics = ServeMetrics(store, trainer, engine, judges)
    policy = PolicyFollower(engine, store, metrics.registry, config.policy_poll_s, per_user=adapters == "per-user")
    service = ChatService(engine, store, config, metrics, {served_name, engine.model_name}, policy)
    retirer = NoteRetirer(engine, store, config, policy.lineage_for) if config.memory_retiring else None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        await policy.sync()  # a restarted server answers with the published version from its first request
        metrics.policy_version.set(engine.policy_version)
        background = [asyncio.create_task(_close_idle_sessions(store, config.session_idle_timeout_s,
                                                               config.episode_idle_timeout_s))]  # fmt: skip
        background.append(asyncio.create_task(policy.run_forever()))
        if config.retain_days is not None:
            background.append(asyncio.create_task(_remove_expired_turns(store, config.retain_days)))
        if judge is not None:
            background.append(asyncio.create_task(judge.run_forever()))
        if retirer is not None:
            background.append(asyncio.create_task(retirer.run_forever()))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await service.drain()
            await engine.close()

    app = FastAPI(title="clawrl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    install_error_handlers(app)
    openapi.install(app, served_name, api_key=config.api_key is not None)

    keys = KeyChecker(config.api_key, store.users)
    app.state.keys = keys

    async def authorize(request: Request) -> Caller:
        return await keys.caller({k.lower(): v for k, v in request.headers.items()})

    app.add_middleware(_CountRequests, metrics=metrics)

    # exclude_unset: no `trainer` without one (but its `pid: null` is kept), no `judges` without actors, no
    # `replicas` with one engine
    @app.get("/healthz", response_model_exclude_unset=True, **openapi.HEALTHZ)
    async def healthz() -> schemas.Health:
        extra: dict[str, Any] = {"trainer": schemas.TrainerStatus(**trainer.status())} if trainer is not None else {}
        if judges is not None:
            extra["judges"] = schemas.JudgeActorsStatus(**judges.status())
        if isinstance(engine, ReplicatedEngine):
            extra["replicas"] = [schemas.ReplicaStatus(**replica) for replica in engine.replica_status()]
        return schemas.Health(status="ok", model=served_name, policy_version=engine.policy_version, **extra)

    @app.get("/readyz", **openapi.READYZ)
    async def readyz() -> JSONResponse:
        problems, published = {}, None
        if problem := engine.not_ready():
            problems["model"] = problem
        try:  # a store that hangs is as unready as one that fails
            published = await asyncio.wait_for(asyncio.to_thread(policy.training.serving_version), READY_STORE_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - any failure to read it is the answer
            problems["store"] = f"{type(error).__name__}: {error}".rstrip(": ")
        body = schemas.Readiness(status="not_ready" if problems else "ready", model=served_name,
                                 policy_version=engine.policy_version, published_version=published, problems=problems)  # fmt: skip
        return JSONResponse(body.model_dump(), status_code=503 if problems else 200)

    @app.get("/metrics", response_class=PlainTextResponse, **openapi.METRICS)
    async def prometheus() -> Response:
        metrics.policy_version.set(engine.policy_version)
        # the judge figures are a store query: keep it off the event loop
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", **openapi.MODELS)
    async def models(request: Request) -> schemas.ModelList:
        await authorize(request)
        return schemas.ModelList(data=[schemas.ModelCard(id=served_name, created=int(time.time()), owned_by="clawrl")])

    @app.post("/v1/chat/completions", **openapi.CHAT_COMPLETIONS)
    async def chat_completions(request: Request) -> Response:
        caller = await authorize(request)
        started = time.perf_counter()
        body = await read_json(request, config.max_body_bytes)
        prepared = await service.prepare(body, {k.lower(): v for k, v in request.headers.items()}, caller=caller)
        generation = await service.start(prepared)  # the session lookup runs on beside it
        if prepared.request.stream:
            await service.identify(generation)  # the headers name the session
            return StreamingResponse(
                timed_stream(service.stream(generation), metrics, started),
                media_type="text/event-stream",
                headers={**service.headers(generation), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        metrics.active.inc()
        try:
            completion = await service.complete(generation)
        finally:
            metrics.active.dec()
            metrics.latency.labels("false").observe(time.perf_counter() - started)
        return JSONResponse(completion.model_dump(exclude_none=True), headers=service.headers(generation))

    # the other wire APIs agents speak, translated to the chat path above (same recording and sessions)
    responses_api.add_routes(app, service, config, metrics, keys)
    messages_api.add_routes(app, service, config, metrics, keys)
    records_api.add_routes(app, store, authorize, policy)
    memory_api.add_routes(app, store, authorize, config)

    @app.post("/v1/feedback", **openapi.FEEDBACK)
    async def feedback(request: Request) -> schemas.FeedbackResponse:
        caller = await authorize(request)
        body = await read_json(request, config.max_body_bytes)
        try:
            item = schemas.FeedbackRequest.model_validate(body)
        except ValidationError as error:
            message, param = describe_validation_error(error)
            raise APIError(400, message, "invalid_value", param) from None
        turn_id = await asyncio.to_thread(_feedback_target, store, item, caller)
        feedback_id = await asyncio.to_thread(store.turns.add_feedback, turn_id, item.score, item.text)
        if item.text and config.memory_limit is not None:  # a correction acts on the user's next prompt (--memory on)
            await asyncio.to_thread(store.memory.remember_for_turn, turn_id, item.text, "feedback", config.memory_limit)
        metrics.feedback.labels(str(item.score)).inc()
        return schemas.FeedbackResponse(id=feedback_id, turn=turn_id, score=item.score)

    episodes = store.episodes

    @app.post("/v1/episodes", **openapi.EPISODE_START)
    async def episode_start(request: Request) -> schemas.EpisodeStartResponse:
        _admin_only(await authorize(request), "episodes")
        item = parse_body(schemas.EpisodeStartRequest, await read_json(request, config.max_body_bytes))
        return await asyncio.to_thread(start_episode, episodes, item)

    @app.post("/v1/episodes/{session_id}/result", **openapi.EPISODE_RESULT)
    async def episode_result(session_id: str, request: Request) -> schemas.EpisodeResultResponse:
        _admin_only(await authorize(request), "episodes")
        item = parse_body(schemas.EpisodeResultRequest, await read_json(request, config.max_body_bytes))
        return await asyncio.to_thread(end_episode, episodes, session_id, item)

    if config.dashboard:
        add_dashboard(app, store, keys.viewer, served_name)
    return app


_KNOWN_PATHS = {"/healthz", "/readyz", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                "/v1/messages/count_tokens", "/v1/feedback", "/v1/episodes", "/v1/sessions"}


class _CountRequests:
    """Counts answered requests by path and status (plain ASGI, so streams pass through untouched)."""

    def __init__(self, app: Any, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in _KNOWN_PATHS else "other"
        for prefix in ("/dashboard", "/v1/episodes/", "/v1/sessions/"):  # paths with a variable part count under their prefix
            if path.startswith(prefix):
                endpoint = prefix.rstrip("/")

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def _feedback_target(store: Store, item: schemas.FeedbackRequest, caller: Caller) -> str:
    """The turn a piece of feedback is about: the named turn, else the session's last main turn. A
    user reaches only their own (another user's turn or session is not found, as one that does not
    exist: a 404 tells nothing of what others hold); the admin reaches every one."""
    if item.turn is not None:
        turn = store.turns.turn(item.turn)
        if turn is None or not reaches(store.turns, caller, turn.session_id):
            raise APIError(404, f"No turn '{item.turn}' is recorded.", "turn_not_found", "turn")
        if item.session_id is not None and turn.session_id not in (item.session_id, scoped_session_id(caller.user_id, item.session_id)):
            raise APIError(400, f"Turn '{item.turn}' does not belong to session '{item.session_id}'.", "invalid_value", "turn")
        return turn.id
    assert item.session_id is not None
    # the admin reaches any session by its id; a user their own session of that name
    session_id = item.session_id if caller.admin else owned_session_id(store.turns, caller.user_id, item.session_id)
    last = store.turns.last_main_turn(session_id) if reaches(store.turns, caller, session_id) else None
    if last is None:
        raise APIError(404, f"Session '{item.session_id}' has no recorded main turn.", "session_not_found", "session_id")
    return last.id


def _admin_only(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise APIError(403, f"Only the admin key reaches {what} so far; a user's key does not.", "admin_only")


async def _close_idle_sessions(store: Store, idle_s: float, episode_idle_s: float) -> None:
    """Close sessions nobody has used for `idle_s` (their last turn will get no next state), and end
    episodes idle for `episode_idle_s` as failed (their group can then train)."""
    period = max(0.5, min(60.0, min(idle_s, episode_idle_s) / 4))
    episodes = store.episodes
    while True:
        await asyncio.sleep(period)
        try:
            abandoned = await asyncio.to_thread(episodes.fail_abandoned, episode_idle_s)
            closed = await asyncio.to_thread(store.turns.close_idle_sessions, idle_s)
        except Exception:  # a busy database must not kill housekeeping; try again next period
            log.exception("closing idle sessions failed")
            continue
        if closed:
            log.info("closed %d idle session(s)", closed)
        if abandoned:
            log.warning("ended %d abandoned episode(s) as failed (no request or result for %gs)", abandoned, episode_idle_s)


RETENTION_PERIOD_S = 600.0  # between retention passes: days are the unit, so ten minutes late costs nothing


async def _remove_expired_turns(store: Store, days: float) -> None:
    """`--retain-days`: a pass at start, then every `RETENTION_PERIOD_S`, off the event loop (a thread),
    in short transactions (`store/retention.py`), so requests go on being answered and recorded."""
    while True:
        try:
            removed = await asyncio.to_thread(remove_older_than, store, days)
        except Exception:  # a busy database must not end retention; the next pass tries again
            log.exception("removing turns older than %g days failed", days)
        else:
            if removed:
                log.info("removed turns older than %g days (--retain-days): %s", days,
                         ", ".join(f"{count} {table}" for table, count in sorted(removed.items())))  # fmt: skip
        await asyncio.sleep(RETENTION_PERIOD_S)
