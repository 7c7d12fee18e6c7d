"""The environment protocol over HTTP, in OpenEnv's shape, both ways.

Served (`create_env_app`, `clawrl envs serve`):

    POST /reset  {seed, episode_id, task}  -> {observation, reward, done, metadata: {episode_id}}
    POST /step   {action, episode_id}      -> {observation, reward, done, metadata: info}
    GET  /state?episode_id=...             -> {episode_id, step_count, task, done, reward}
    GET  /health -> {status: "healthy"};  GET /schema -> {action, observation, state} JSON schemas
    GET  /metadata, and our extensions GET /tasks?split=train|eval and POST /close {episode_id}

OpenEnv's HTTP endpoints keep no episode between requests (its sessions live on a WebSocket);
ours keep one environment per running episode, leased from a pool (`pool.py`): `/reset` opens an
episode under `episode_id` (generated when the body has none, returned in `metadata`), and
`/step`, `/state` and `/close` name it, or, without a name, mean the most recently opened one, so a
plain OpenEnv client that sends no id drives one episode at a time. An episode that ends gives
its environment back warm, so the next `/reset` resets it instead of starting a new one (a
browser, a sandbox), and keeps its final state for `/state`. Bad requests get OpenAI-style error
objects with a 4xx (an unknown episode 404, a step after the end 409, all `max_episodes`
environments running 429); an environment that crashes or outlives `step_timeout_s` answers 500
with the reason, and its episode is closed with its environment. An episode nobody has touched
for `idle_timeout_s` is closed (its sandbox with it), and so is a warm environment: a client
that dies without /close does not hold a slot for ever (use is a /reset or a /step; reading
/state is not). `/metadata` counts the environments started, reused, running and warm.

Driven (`HTTPEnvironment`): any server of this shape is an `Environment`. A clawrl server's
observations are chat messages already. For another OpenEnv server, whose actions and
observations are its own JSON, the client offers the model one tool, `act`, whose parameters are
the server's action schema (from /schema); each `act` call is one /step, answered by a tool
message holding the observation as JSON, with the server's step rewards passed through. A message
without a tool call ends such an episode.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from clawrl.envs.episode import parse_arguments
from clawrl.envs.pool import EnvPool, Lease, LeaseExpiredError, PoolFullError
from clawrl.envs.protocol import (
    Action,
    ChatMessage,
    CloseRequest,
    EnvResponse,
    Environment,
    EpisodeOverError,
    EpisodeState,
    Observation,
    ResetRequest,
    SchemaResponse,
    Split,
    StepRequest,
    StepResult,
)
from clawrl.errors import APIError, describe_validation_error, install_error_handlers
from clawrl.jsonbody import parse_json_body

log = logging.getLogger(__name__)


# --- the server -----------------------------------------------------------------------------------


@dataclass
class _Episode:
    lease: Lease | None  # None once the episode is over: its environment went back to the pool
    final: EpisodeState | None = None  # the state it ended in, for /state after the end
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one step at a time per episode


class _Episodes:
    """Episodes by id, newest last, each holding a lease on the pool's environments while it runs.

    An episode that ends gives its environment back warm (the next /reset resets it instead of
    starting another) and keeps only its final state; an episode that fails closes its environment.
    The pool's lease timeout is the idle timeout: every /reset and /step beats its lease.
    """

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.open: dict[str, _Episode] = {}

    def get(self, episode_id: str | None) -> tuple[str, _Episode]:
        """The episode `episode_id` names (the latest without one); 404 when there is none or it was reaped."""
        if episode_id is None and self.open:
            episode_id = next(reversed(self.open))
        episode = self.open.get(episode_id) if episode_id is not None else None
        if episode is None or (episode.lease is not None and episode.lease.expired):
            named = f" {episode_id!r}" if episode_id else ""
            raise APIError(404, f"no open episode{named}: POST /reset first", "episode_not_found", "episode_id")
        return str(episode_id), episode

    async def start(self, episode_id: str, seed: int, task: str | None) -> Observation:
        """Open `episode_id` on a leased environment (starting it over when it is open)."""
        await self.close(episode_id)
        try:
            lease = await self.pool.lease()
        except PoolFullError:
            raise APIError(429, f"{self.pool.capacity} episodes are running: POST /close one first", "too_many_episodes") from None
        try:
            observation = await lease.reset(seed, task)
        except ValueError as error:  # an unknown task: the environment is as good as before
            await self.pool.release(lease, healthy=True)
            raise APIError(400, str(error), "invalid_task", "task") from None
        except BaseException:
            await self.pool.release(lease, healthy=False)
            raise
        self.open[episode_id] = _Episode(lease)
        self._forget_oldest_finished()
        return observation

    async def step(self, episode_id: str, episode: _Episode, action: Action) -> StepResult:
        if episode.lease is None:
            raise APIError(409, "the episode is over: POST /reset", "episode_over")
        try:
            result = await episode.lease.step(action)
        except EpisodeOverError as error:
            raise APIError(409, f"{error}: POST /reset", "episode_over") from None
        except LeaseExpiredError:
            raise APIError(404, f"episode {episode_id!r} was closed after being idle: POST /reset", "episode_not_found",
                           "episode_id") from None  # fmt: skip
        except Exception as error:  # the environment crashed or hung: this episode is over, the server is not
            log.exception("environment step failed in episode %s", episode_id)
            await self.close(episode_id, healthy=False)
            kind = "did not answer in time" if isinstance(error, TimeoutError) else f"failed: {type(error).__name__}: {error}"
            raise APIError(500, f"the environment {kind}", "environment_error") from None
        if result.done:
            episode.final = await episode.lease.env.state()
            await self.pool.release(episode.lease, healthy=True)
            episode.lease = None
        return result

    async def state(self, episode: _Episode) -> EpisodeState:
        if episode.final is not None or episode.lease is None:
            return episode.final or EpisodeState()
        return await episode.lease.env.state()  # looking is not using: no heartbeat

    async def close(self, episode_id: str, healthy: bool = True) -> None:
        episode = self.open.pop(episode_id, None)
        if episode is not None and episode.lease is not None:
            await self.pool.release(episode.lease, healthy=healthy)

    def _forget_oldest_finished(self) -> None:
        """Keep the final state of at most `capacity` finished episodes."""
        finished = [key for key, episode in self.open.items() if episode.lease is None]
        for episode_id in finished[: max(0, len(finished) - self.pool.capacity)]:
            del self.open[episode_id]

    async def reap_forever(self, every_s: float) -> None:
        """Take back leases nobody has used for the idle timeout, close long-idle warm environments."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.pool.reap()
                for episode_id in [key for key, episode in self.open.items() if episode.lease and episode.lease.expired]:
                    del self.open[episode_id]
                    log.info("closed episode %s: idle past the timeout", episode_id)
            except Exception:  # an environment that fails to close must not stop the reaping
                log.exception("closing idle episodes failed")


class _JSONRequest(Request):
    """A request whose JSON body is parsed by `parse_json_body`, once (see `_JSONBodyRoute`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_parsed_json"):
            self._parsed_json = parse_json_body(await self.body())
        return self._parsed_json


class _JSONBodyRoute(APIRoute):
    """A route that parses a JSON body itself before FastAPI validates it against the route's model.

    FastAPI turns any failure of its own `json.loads` other than a decode error (an integer over
    Python's 4,300-digit conversion limit, a nesting that overflows the parser's stack) into a bare
    "There was an error parsing the body" without a code, and lets through what parses but cannot
    be answered (a lone surrogate: the answer echoing it failed to encode, a 500). Parsing here,
    outside FastAPI's handling, raises the same `invalid_json` error objects as `clawrl serve`;
    FastAPI then reads the parsed value back from `_JSONRequest.json`.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def parse_then_handle(request: Request) -> Response:
            request = _JSONRequest(request.scope, request.receive)
            if takes_body and await request.body():  # an empty body is /reset's "no options"
                await request.json()  # raises APIError, answered by install_error_handlers
            return await handler(request)

        return parse_then_handle


def create_env_app(make_env: Callable[[], Environment], description: str = "", max_episodes: int = 64,
                   idle_timeout_s: float = 600.0, step_timeout_s: float = 120.0) -> FastAPI:
    """An app serving environments from `make_env`, one per running episode, kept warm between episodes."""
    pool = EnvPool(make_env, max_episodes, idle_s=idle_timeout_s, lease_timeout_s=idle_timeout_s, step_timeout_s=step_timeout_s)
    episodes = _Episodes(pool)
    lister = make_env()  # answers /tasks; never runs an episode

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(episodes.reap_forever(max(0.1, idle_timeout_s / 4)))
        try:
            yield
        finally:
            reaper.cancel()
            await pool.close()
            await lister.close()

    app = FastAPI(title=f"clawrl environment: {lister.name}", lifespan=lifespan)
    app.router.route_class = _JSONBodyRoute  # every route added below parses its body with parse_json_body
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {"name": lister.name, "description": description, "environments": asdict(pool.stats) | {"running": len(pool.leased),
                "warm": len(pool.warm), "capacity": pool.capacity}}  # fmt: skip

    @app.get("/schema")
    async def schema() -> SchemaResponse:
        return SchemaResponse(
            action=Action.model_json_schema(), observation=Observation.model_json_schema(), state=EpisodeState.model_json_schema()
        )

    @app.get("/tasks")
    async def tasks(split: Split = Query("train", description="train or eval")) -> dict[str, list[str]]:
        return {"tasks": await lister.tasks(split)}

    @app.post("/reset")
    async def reset(request: ResetRequest | None = None) -> EnvResponse:
        request = request or ResetRequest()
        episode_id = request.episode_id or uuid.uuid4().hex
        observation = await episodes.start(episode_id, request.seed or 0, request.task)
        return EnvResponse(observation=observation.model_dump(exclude_none=True), metadata={"episode_id": episode_id})

    @app.post("/step")
    async def step(request: StepRequest) -> EnvResponse:
        episode_id, episode = episodes.get(request.episode_id)
        try:
            action = Action.model_validate(request.action)
        except ValidationError as error:
            message, param = describe_validation_error(error)
            raise APIError(400, f"action.{message}", "invalid_action", f"action.{param}" if param else "action") from None
        async with episode.lock:
            result = await episodes.step(episode_id, episode, action)
        return EnvResponse(observation=result.observation.model_dump(exclude_none=True), reward=result.reward,
                           done=result.done, metadata={**result.info, "episode_id": episode_id})  # fmt: skip

    @app.get("/state")
    async def state(episode_id: str | None = Query(None, description="The episode; the latest when absent.")) -> EpisodeState:
        key, episode = episodes.get(episode_id)
        return (await episodes.state(episode)).model_copy(update={"episode_id": key})

    @app.post("/close")
    async def close(request: CloseRequest) -> dict[str, str]:
        episodes.get(request.episode_id)  # 404 for an unknown one
        await episodes.close(request.episode_id)
        return {"episode_id": request.episode_id, "status": "closed"}

    return app


# --- the client -----------------------------------------------------------------------------------


class EnvServerError(RuntimeError):
    """The environment server refused a request or failed."""


_ACT_DESCRIPTION = "Take one action in the environment; the arguments are the action as JSON."


class HTTPEnvironment(Environment):
    """An environment behind an OpenEnv-shaped HTTP server (a clawrl one or another)."""

    name = "http"

    def __init__(self, base_url: str, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._episode_id: str | None = None
        self._act_schema: dict[str, Any] | None = None  # set for servers whose actions are not chat messages

    async def tasks(self, split: Split) -> list[str]:
        response = await self._request("GET", "/tasks", params={"split": split}, missing_ok=True)
        return response["tasks"] if response else []

    async def reset(self, seed: int, task: str | None = None) -> Observation:
        self._episode_id = uuid.uuid4().hex
        body: dict[str, Any] = {"seed": seed, "episode_id": self._episode_id} | ({"task": task} if task else {})
        response = await self._request("POST", "/reset", json=body)
        observation = response["observation"]
        if "messages" in observation:
            self._act_schema = None
            return Observation.model_validate(observation)
        self._act_schema = (await self._request("GET", "/schema"))["action"]
        tool = {"type": "function", "function": {"name": "act", "description": _ACT_DESCRIPTION, "parameters": self._act_schema}}
        return Observation(messages=[_observation_message("user", observation)], tools=[tool])

    async def step(self, action: Action) -> StepResult:
        if self._episode_id is None:
            raise EpisodeOverError("no episode in progress: reset first")
        if self._act_schema is not None:
            return await self._act(action)
        body = {"action": action.model_dump(exclude_none=True), "episode_id": self._episode_id}
        response = await self._request("POST", "/step", json=body)
        info = {key: value for key, value in (response.get("metadata") or {}).items() if key != "episode_id"}
        return StepResult(observation=Observation.model_validate(response["observation"]),
                          reward=response.get("reward") or 0.0, done=response["done"], info=info)  # fmt: skip

    async def state(self) -> EpisodeState:
        response = await self._request("GET", "/state", params={"episode_id": self._episode_id} if self._episode_id else None)
        return EpisodeState.model_validate({key: value for key, value in response.items() if key in EpisodeState.model_fields})

    async def close(self) -> None:
        episode_id, self._episode_id = self._episode_id, None
        if episode_id is not None and self._act_schema is None:
            await self._request("POST", "/close", json={"episode_id": episode_id}, missing_ok=True)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _act(self, action: Action) -> StepResult:
        """Each `act` call is one step of the server; a message without one ends the episode."""
        assert self._act_schema is not None
        messages, reward, done = [], 0.0, not action.tool_calls
        for call in action.tool_calls:
            arguments, problem = parse_arguments(call.function.arguments, self._act_schema)
            if call.function.name != "act":
                problem = f"there is no tool {call.function.name!r}; the only tool is 'act'"
            if problem or done:
                text = f"error: {problem}" if problem else "error: the episode is over"
                messages.append(ChatMessage(role="tool", tool_call_id=call.id, content=text))
                continue
            try:
                response = await self._request("POST", "/step", json={"action": arguments, "episode_id": self._episode_id})
            except EnvServerError as error:  # the server refused this action: the model hears why
                messages.append(ChatMessage(role="tool", tool_call_id=call.id, content=f"error: {error}"))
                continue
            messages.append(_observation_message("tool", response["observation"], call.id))
            reward += response.get("reward") or 0.0
            done = response.get("done", False)
        return StepResult(observation=Observation(messages=messages), reward=reward, done=done)

    async def _request(self, method: str, path: str, missing_ok: bool = False, **kwargs: Any) -> Any:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s)
        response = await self._client.request(method, path, **kwargs)
        if missing_ok and response.status_code == 404:  # an extension this server lacks, or a closed episode
            return None
        if response.status_code == 409:
            raise EpisodeOverError(_error_text(response))
        if response.is_error:
            raise EnvServerError(f"{method} {path} answered {response.status_code}: {_error_text(response)}")
        return response.json()


def _observation_message(role: Literal["user", "tool"], observation: dict[str, Any], call_id: str | None = None) -> ChatMessage:
    return ChatMessage(role=role, content=json.dumps(observation, ensure_ascii=False), tool_call_id=call_id)


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return json.dumps(body)[:500]
