"""The `openai` judge backend: a language model behind any OpenAI-compatible endpoint.

For each turn it samples `prm_m` PRM outputs and `prm_m` hint-judge outputs, all at once
(`judge/sampled.py`): the score is the majority of the valid votes (0 on a tie or when none is
valid) and every valid hint is a candidate.

Remote endpoints fail in passing (dropped connections, overloaded servers answering 5xx, calls
that hang), so each call has its own timeout and is retried with exponential back-off. A 4xx is
the endpoint refusing this request (bad model id, bad key, prompt too long): asking again cannot
help, so it fails the turn at once and the worker gives the turn back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from clawrl.config import JudgeConfig
from clawrl.judge.sampled import judge_by_sampling
from clawrl.judge.types import BackendVerdict
from clawrl.types import TurnContext

log = logging.getLogger(__name__)


class OpenAIJudge:
    """PRM votes and hint candidates from an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        votes: int = 1,
        temperature: float = 0.6,
        max_tokens: int = 512,
        attempts: int = 4,
        call_timeout_s: float = 20.0,
        backoff_s: float = 0.2,
    ) -> None:
        self.name = model  # stored as the judgment's source and judge model
        self.url = url.rstrip("/")
        self.model = model
        self.votes = votes
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.attempts = attempts
        self.call_timeout_s = call_timeout_s
        self.backoff_s = backoff_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @classmethod
    def from_config(cls, config: JudgeConfig) -> OpenAIJudge:
        assert config.judge_url and config.judge_model, "JudgeConfig refuses --judge openai without both"
        return cls(
            config.judge_url,
            config.judge_model,
            api_key=config.judge_api_key,
            votes=config.prm_m,
            temperature=config.judge_temperature,
            max_tokens=config.judge_max_tokens,
            attempts=config.judge_retries,
            call_timeout_s=config.judge_call_timeout_s,
        )

    async def judge(self, case: TurnContext) -> BackendVerdict:
        # The client lives for one turn because a worker may be driven from different event loops
        # (an httpx pool is bound to its loop).
        async with httpx.AsyncClient(headers=self.headers, timeout=self.call_timeout_s) as client:
            return await judge_by_sampling(case, self.votes, lambda messages: self._complete(client, messages))

    async def _complete(self, client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> str:
        """One sampled output, retried on transport errors, timeouts and 5xx; raises on 4xx or when out of attempts."""
        body = {"model": self.model, "messages": messages, "temperature": self.temperature, "max_tokens": self.max_tokens}
        for attempt in range(self.attempts):
            try:
                response = await client.post(f"{self.url}/chat/completions", json=body)
                response.raise_for_status()
            except (httpx.TransportError, httpx.HTTPStatusError) as error:  # timeouts are transport errors
                retryable = not isinstance(error, httpx.HTTPStatusError) or error.response.is_server_error
                if not retryable or attempt + 1 == self.attempts:
                    raise
                delay = self.backoff_s * 2**attempt
                log.warning("judge call failed (%r); retrying in %.2f s", error, delay)
                await asyncio.sleep(delay)
                continue
            return response.json()["choices"][0]["message"]["content"] or ""
        raise AssertionError("unreachable: the last attempt returns or raises")
