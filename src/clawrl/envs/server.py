"""The model behind a clawrl server as a policy (DESIGN §9: episodes run through the server).

Each episode is its own session, named by a fresh id sent as `X-Session-Id` on every request, so
each model step is a recorded main turn (exact token ids and log-probs) and the environment's
answer to it reaches the store as that turn's next state, carried by the session's next request.
Before the first step the episode is registered (`POST /v1/episodes`: env, task, group, seed), so
the trainer knows its turns for an episode's; after the last, its result is reported
(`POST /v1/episodes/{session_id}/result`: outcome, per-step environment rewards, or why it
failed), with the last step's observation, which no later request carries.

Episodes of the eval split are measurements, not experience: they are played as side turns
(`X-Turn-Type: side`: recorded, never judged or trained on) and not registered, so evaluating a
policy never changes it.

Only HTTP here: envs never import the server's packages.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from clawrl.config import RolloutConfig
from clawrl.envs.protocol import Environment
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.types import Message, ToolSpec


class ServerError(RuntimeError):
    """The server refused a request (its OpenAI-style error message is kept)."""


async def _request(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    response = await http.request(method, path, **kwargs)
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise ServerError(f"{method} {path}: {response.status_code} {message}")
    return response


class ServerPolicy:
    """One episode's policy: each step asks the server's model, in the episode's session."""

    def __init__(self, http: httpx.AsyncClient, model: str, session_id: str, planned: PlannedEpisode, config: RolloutConfig) -> None:
        self.http, self.model, self.session_id, self.planned, self.config = http, model, session_id, planned, config
        self.steps = 0

    async def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        body = {
            "model": self.model,
            "messages": messages,
            "tools": tools or None,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            "seed": (self.planned.seed << 16) + self.steps,  # reproducible, and distinct for every episode and step
        }
        self.steps += 1
        headers = {"X-Session-Id": self.session_id}
        if self.config.split == "eval":
            headers["X-Turn-Type"] = "side"
        response = await _request(self.http, "POST", "/chat/completions", json=body, headers=headers)
        # the server parsed the model's tool calls; its message is the action as OpenAI shapes it
        message: Message = response.json()["choices"][0]["message"]
        return message

    async def finish(self, record: EpisodeRecord) -> None:
        """Report the episode's result; a failed one carries its error instead of an outcome."""
        if self.config.split == "eval":
            return  # never registered: nothing to train on
        result: dict[str, Any] = {"failed": record.failed, "error": record.error, "step_rewards": record.step_rewards}
        if not record.failed:
            result |= {"reward": record.reward, "final_observation": record.final_observation()}
        await _request(self.http, "POST", f"/episodes/{self.session_id}/result", json=result)


class ServerPolicies:
    """The policy factory of `clawrl rollout --server`: registers each episode, in its group, and plays it."""

    def __init__(self, http: httpx.AsyncClient, model: str, env_name: str, config: RolloutConfig, run_id: str | None = None) -> None:
        self.http, self.model, self.env_name, self.config = http, model, env_name, config
        # group ids are unique across rollout runs on one store; a run spread over several processes
        # (`ray_rollout.py`) gives them one run id, so that a group's episodes share its id wherever they ran
        self.placed = run_id is not None
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex[:12]

    async def __call__(self, _env: Environment, planned: PlannedEpisode) -> ServerPolicy:
        # a placed run's driver must know an episode's session without asking the process that plays it
        session_id = episode_session_id(self.run_id, planned) if self.placed else f"episode-{uuid.uuid4().hex}"
        if self.config.split == "eval":
            return ServerPolicy(self.http, self.model, session_id, planned, self.config)
        episode = {"session_id": session_id, "env": self.env_name, "task": planned.task, "seed": planned.seed,
                   "group_id": f"{self.run_id}-{planned.group}", "group_size": planned.group_size}  # fmt: skip
        await _request(self.http, "POST", "/episodes", json=episode)
        return ServerPolicy(self.http, self.model, session_id, planned, self.config)


def episode_session_id(run_id: str, planned: PlannedEpisode) -> str:
    """The session of a planned episode of a placed run (the plan gives every episode its own seed)."""
    return f"episode-{run_id}-{planned.seed}"


def server_client(config: RolloutConfig) -> httpx.AsyncClient:
    """An HTTP client of the server at `config.server`, with its key."""
    assert config.server is not None
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    return httpx.AsyncClient(base_url=config.server.rstrip("/"), headers=headers, timeout=config.episode_timeout_s)


@asynccontextmanager
async def server_policies(config: RolloutConfig, env_name: str, run_id: str | None = None) -> AsyncIterator[ServerPolicies]:
    """Policies backed by the model at `config.server` (its first listed model), over one HTTP client."""
    async with server_client(config) as http:
        model = (await _request(http, "GET", "/models")).json()["data"][0]["id"]
        yield ServerPolicies(http, model, env_name, config, run_id)


async def end_as_failed(config: RolloutConfig, session_ids: list[str], error: str) -> dict[str, str]:
    """End these registered episodes as failed with `error` (their player is gone and never will):
    for each, `failed`, `unregistered` (it never reached the server) or `ended` (its player had
    ended it first; what it recorded stands). An eval split registers nothing: no call."""
    if config.split == "eval" or not session_ids:
        return {}
    outcome: dict[str, str] = {}
    async with server_client(config) as http:
        for session_id in session_ids:
            response = await http.post(f"/episodes/{session_id}/result", json={"failed": True, "error": error, "step_rewards": []})
            codes = {200: "failed", 404: "unregistered", 409: "ended"}
            if response.status_code not in codes:
                raise ServerError(f"POST /episodes/{session_id}/result: {response.status_code} {response.text[:500]}")
            outcome[session_id] = codes[response.status_code]
    return outcome
