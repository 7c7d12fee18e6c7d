"""The `openai` engine: another server does the model work, spoken to in token ids (DESIGN §7).

Any OpenAI-compatible server whose `/v1/completions` takes a prompt of token ids and answers with
token ids and per-token log-probs will do; vLLM's does (`return_token_ids`,
`return_tokens_as_token_ids`, `prompt_logprobs`). clawrl still renders the chat template itself
(the tokenizer is loaded locally from `--model`), sends the exact prompt ids and records the exact
ids that come back: nothing is re-tokenized on either side.

What each engine call becomes
-----------------------------
* `generate`: a streamed `/v1/completions` with the prompt ids, `logprobs` (the sampled token's
  log-prob and the top alternatives, ids spelled `token_id:N`) and the request's seed. The
  server's log-probs must be the raw model distribution (temperature 1, before top-p), as the hf
  engine reports: vLLM's default `--logprobs-mode raw_logprobs` is. The stream's last step is the
  end-of-turn token with finish_reason "stop", or the step that reached `max_tokens` ("length").
  `cancel()` hangs up, which makes vLLM abort the request.
* `score`: a completion of one token whose prompt is prompt + response, asking for
  `prompt_logprobs`: the teacher-forced log-probs of every response token and its top-k.
* `load_version`: a LoRA version is loaded at runtime under a name never used before
  (`POST /v1/load_lora_adapter`; vLLM needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), becomes the
  model new requests name, and is unloaded once it is neither current nor used by a request in
  flight. Each request names its version's model for its whole life, so a swap never moves it,
  and vLLM keys its prefix cache by adapter, so a cached prefix never crosses versions.

What it cannot do: swap full weights (a remote server has no call for it: train LoRA, the default,
or use `--engine vllm`, which starts a second server), or load adapters on a server started
without runtime LoRA loading. Both are refused with an error that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from clawrl.config import EngineConfig
from clawrl.engines.base import (
    Engine,
    EngineClosedError,
    GenerationStream,
    SamplingParams,
    TokenStep,
    validate_sampling,
    validated_token_ids,
)
from clawrl.types import SHARED_LINEAGE, ScoredResponse
from clawrl.versions.table import VersionTable

logger = logging.getLogger(__name__)

_TOKEN_PREFIX = "token_id:"  # how vLLM spells a token with return_tokens_as_token_ids


class RemoteEngineError(RuntimeError):
    """The remote server refused a call or cannot do what was asked; the message says which."""


@dataclass
class RemoteVersion:
    """A policy version as the remote side knows it: the model name requests carry, and where."""

    model: str  # the `model` field of its requests: the base model's name or a LoRA adapter's
    base_url: str  # the server that has it (a full-weight version of `vllm` has its own server)
    lora: bool = False
    lora_id: int | None = None  # the server's own integer id of the adapter, where the engine knows it


def parse_token(spelled: str) -> int:
    """`token_id:123` -> 123 (the spelling `return_tokens_as_token_ids` gives)."""
    if not spelled.startswith(_TOKEN_PREFIX):
        raise RemoteEngineError(f"the server did not spell tokens as ids ({spelled!r}): it needs return_tokens_as_token_ids")
    return int(spelled[len(_TOKEN_PREFIX) :])


def steps_from_chunk(choice: dict[str, Any], top_logprobs: int) -> list[TokenStep]:
    """The generated tokens of one streamed completion choice, with their log-probs."""
    token_ids = choice.get("token_ids") or []
    logprobs = choice.get("logprobs") or {}
    sampled = logprobs.get("token_logprobs") or []
    alternatives = logprobs.get("top_logprobs") or []
    if len(sampled) != len(token_ids):
        raise RemoteEngineError(f"the server sent {len(token_ids)} token ids but {len(sampled)} log-probs")
    steps = []
    for position, token_id in enumerate(token_ids):
        ranked = sorted((alternatives[position] or {}).items(), key=lambda item: -item[1]) if position < len(alternatives) else []
        top = [(parse_token(spelled), float(value)) for spelled, value in ranked[:top_logprobs]]
        steps.append(TokenStep(int(token_id), float(sampled[position]), top))
    return steps


def scored_from_prompt_logprobs(entries: list[dict[str, Any] | None], prompt_length: int, response: list[int], top_k: int) -> ScoredResponse:
    """`prompt_logprobs` of prompt + response -> the response's teacher-forced log-probs and top-k."""
    tail = entries[prompt_length:]
    if len(tail) != len(response):
        raise RemoteEngineError(f"the server scored {len(tail)} response positions, expected {len(response)}")
    logprobs, top_ids, top_values = [], [], []
    for token_id, entry in zip(response, tail, strict=True):
        by_id = {int(key): value for key, value in (entry or {}).items()}
        if token_id not in by_id:
            raise RemoteEngineError("the server's prompt_logprobs left out a prompt token")
        logprobs.append(float(by_id[token_id]["logprob"]))
        ranked = sorted(((key, value) for key, value in by_id.items() if value["rank"] <= top_k), key=lambda kv: kv[1]["rank"])
        top_ids.append([key for key, _ in ranked[:top_k]])
        top_values.append([float(value["logprob"]) for _, value in ranked[:top_k]])
    return ScoredResponse(logprobs, top_ids, top_values)


class RemoteEngine(Engine):
    """Drives an OpenAI-compatible server in token ids; see the module docstring."""

    def __init__(self, config: EngineConfig, model_path: str | Path | None = None) -> None:
        """`model_path` is where the tokenizer (and config) are read from (default: `config.model`)."""
        self.config = config
        self._source = str(model_path if model_path is not None else config.model)
        self.model_name = config.model
        self.tokenizer = AutoTokenizer.from_pretrained(self._source)
        text_config = AutoConfig.from_pretrained(self._source).get_text_config()
        self._vocab_size: int = text_config.vocab_size
        self.max_context_tokens = int(config.max_context_tokens or getattr(text_config, "max_position_embeddings", 0) or 0)
        self._base_url = (config.engine_url or "").rstrip("/")  # the `vllm` engine sets its own server
        self._versions: VersionTable[RemoteVersion] = VersionTable()  # version 0 once started
        self._end_ids: frozenset[int] = frozenset()
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Find the served model and its context size; version 0 is the base model. (`EngineConfig`
        refuses `--engine openai` without `--engine-url`; `vllm` sets its own server's URL.)"""
        listing = await self._request("GET", self._base_url, "/models")
        roots = [card for card in listing.get("data", []) if not card.get("parent")]
        if not roots:
            raise RemoteEngineError(f"{self._base_url}/models lists no model")
        base = roots[0]
        served_context = base.get("max_model_len")
        if served_context:
            self.max_context_tokens = min(self.max_context_tokens or served_context, int(served_context))
        if not self.max_context_tokens:
            raise RemoteEngineError(f"{self._source} does not declare its context size; set --max-context-tokens")
        self._versions.install(0, RemoteVersion(base["id"], self._base_url))
        self._end_ids = frozenset(self._end_of_turn_ids())

    async def close(self) -> None:
        """Hang up every request in flight (their streams end with `EngineClosedError`)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._client is not None:
            with contextlib.suppress(RuntimeError):  # its loop may be gone already
                await self._client.aclose()
            self._client = None

    def _end_of_turn_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        with contextlib.suppress(OSError, ValueError):  # a model without generation_config.json
            configured = GenerationConfig.from_pretrained(self._source).eos_token_id
            ids.update(configured if isinstance(configured, list) else [configured])
        return {token for token in ids if token is not None}

    def not_ready(self) -> str | None:
        return "the engine is not running" if self._closed or 0 not in self._versions else None

    def _check_running(self) -> None:
        if self._closed or 0 not in self._versions:
            raise EngineClosedError("the engine is not running (call start(), and not after close())")

    # --- public API -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The server that has the base model (and every LoRA version)."""
        return self._versions.get(0).base_url if 0 in self._versions else self._base_url

    @property
    def policy_version(self) -> int:
        """The version new requests get; requests in flight keep the one they started with."""
        return self._versions.current

    def lineage_version(self, lineage: str) -> int | None:
        return self._versions.current_of(lineage)

    def held_versions(self) -> list[int]:
        return [version for version, _ in self._versions.items()]

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                 lineage: str = SHARED_LINEAGE) -> GenerationStream:  # fmt: skip
        """Start a streamed completion at once, with `lineage`'s current version (its adapter's name is
        the request's model: the server batches requests of different adapters); see the module docstring."""
        self._check_running()
        validate_sampling(sampling)
        prompt = validated_token_ids(prompt_token_ids, self._vocab_size, "prompt")
        if not 0 < len(prompt) < self.max_context_tokens:
            raise ValueError(f"the prompt must have 1 to {self.max_context_tokens - 1} tokens, got {len(prompt)}")
        version = self._versions.use(lineage)  # LineageNotLoadedError when it is not held
        stream = GenerationStream(version)
        body = self._completion_body(self._versions.get(version), prompt, sampling)
        task = asyncio.get_running_loop().create_task(self._relay(version, body, sampling.top_logprobs, stream))
        self._track(version, task)
        stream.on_cancel(task.cancel)
        return stream

    async def score(
        self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0, version: int | None = None
    ) -> ScoredResponse:
        """Teacher-forced raw log-probs of the response under `version` (None = the current one)."""
        self._check_running()
        prompt = validated_token_ids(prompt_token_ids, self._vocab_size, "prompt")
        response = validated_token_ids(response_token_ids, self._vocab_size, "response")
        if not prompt:
            raise ValueError("the prompt must not be empty")
        if len(prompt) + len(response) >= self.max_context_tokens:
            raise ValueError(f"prompt + response exceed the context of {self.max_context_tokens - 1} scorable tokens")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        number = self.policy_version if version is None else version
        self._versions.get(number)  # ValueError when it is not loaded
        if not response:
            return ScoredResponse([], [], [])
        held = self._versions.pin(number)
        try:
            body = {"model": held.model, "prompt": prompt + response, "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": top_k, "return_token_ids": True}  # fmt: skip
            answer = await self._request("POST", held.base_url, "/completions", body)
        finally:
            self._versions.unpin(number)
            self._retire_unused()
        return scored_from_prompt_logprobs(answer["choices"][0].get("prompt_logprobs") or [], len(prompt), response, top_k)

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        """Make `version` the one `lineage`'s new requests get; requests in flight keep theirs."""
        self._check_running()
        path = Path(path)
        if version in self._versions:
            self._versions.make_current(version, lineage)  # the base, or a version still held
        elif (path / "adapter_config.json").is_file():
            base = self._versions.get(0)  # an adapter is a delta on the base model: it goes where the base is
            model = f"{base.model}-v{version}-{uuid.uuid4().hex[:8]}"  # never reused
            self._versions.install(version, await self._load_adapter(base, model, path), lineage)
        else:
            self._versions.install(version, await self._load_full_weights(version, path), lineage)
        self._retire_unused()

    async def _load_adapter(self, base: RemoteVersion, model: str, path: Path) -> RemoteVersion:
        """Load the adapter at `path` under the new name `model` on the base model's server."""
        await self._request("POST", base.base_url, "/load_lora_adapter", {"lora_name": model, "lora_path": str(path.resolve())})
        return RemoteVersion(model, base.base_url, lora=True)

    async def _load_full_weights(self, version: int, path: Path) -> RemoteVersion:
        raise RemoteEngineError(
            f"--engine openai cannot swap in full weights (version {version}, {path}): a remote server has no call for "
            "that. Train LoRA adapters (the default, without --full), or use --engine vllm"
        )

    async def _retire_version(self, held: RemoteVersion) -> None:
        """Free a version nothing uses any more: a LoRA adapter is unloaded by name. On vLLM that
        only forgets the name; the adapter keeps its slot (see `VLLMEngine`, which frees it too)."""
        if held.lora:
            await self._request("POST", held.base_url, "/unload_lora_adapter", {"lora_name": held.model})

    # --- versions ---------------------------------------------------------------------------

    def _track(self, version: int, task: asyncio.Task[None]) -> None:
        self._versions.pin(version)
        self._tasks.add(task)

        def done(_: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._versions.unpin(version)
            self._retire_unused()

        task.add_done_callback(done)

    def _retire_unused(self) -> None:
        if self._closed:
            return
        for number, held in self._versions.retire_unused(max_loaded=self.config.max_loaded_adapters):
            retiring = asyncio.get_running_loop().create_task(self._retire_quietly(number, held))
            self._tasks.add(retiring)
            retiring.add_done_callback(self._tasks.discard)

    async def _retire_quietly(self, number: int, held: RemoteVersion) -> None:
        try:
            await self._retire_version(held)
        except RemoteEngineError as error:  # a leftover adapter costs memory, not correctness
            logger.warning("could not release policy version %d (%s): %s", number, held.model, error)

    # --- the wire ---------------------------------------------------------------------------

    def _completion_body(self, held: RemoteVersion, prompt: list[int], sampling: SamplingParams) -> dict[str, Any]:
        room = self.max_context_tokens - len(prompt)
        body: dict[str, Any] = {
            "model": held.model,
            "prompt": prompt,
            "max_tokens": min(sampling.max_tokens, room),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": sampling.top_logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            # the model's end-of-turn tokens, whatever the server's own generation config says
            "stop_token_ids": sorted(self._end_ids),
            "stream": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.grammar is not None:  # only an engine that says `constrained_decoding` is sent one
            body["structured_outputs"] = {"grammar": sampling.grammar}
        return body

    async def _relay(self, version: int, body: dict[str, Any], top_logprobs: int, stream: GenerationStream) -> None:
        """Pass the server's streamed tokens on to `stream`, marking the last one."""
        held = self._versions.get(version)
        try:
            pending: TokenStep | None = None
            finish: str | None = None
            async for choice in self._stream(held.base_url, body):
                for step in steps_from_chunk(choice, top_logprobs):
                    if pending is not None:
                        stream.push(pending)
                    pending = step
                finish = choice.get("finish_reason") or finish
            if pending is None:
                raise RemoteEngineError("the server finished without generating a token")
            pending.finish_reason = "stop" if finish == "stop" and pending.token_id in self._end_ids else "length"
            stream.push(pending)
            stream.finish()
        except asyncio.CancelledError:
            stream.fail(EngineClosedError("the request was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - every failure reaches the consumer, never the loop's log
            stream.fail(error if isinstance(error, (RemoteEngineError, ValueError)) else RemoteEngineError(f"{type(error).__name__}: {error}"))

    def _http(self) -> httpx.AsyncClient:
        """One connection pool per event loop (tests may run the engine from several loops)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(headers=_auth_headers(self.config), timeout=self.config.engine_timeout_s, limits=limits)
            self._client_loop = loop
        return self._client

    async def _request(self, method: str, base_url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = await self._http().request(method, f"{base_url}{path}", json=body)
        except httpx.HTTPError as error:
            raise RemoteEngineError(f"cannot reach the engine server at {base_url}: {error}") from error
        return _json_or_raise(response)

    async def _stream(self, base_url: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The choices of a streamed completion, one server-sent event at a time."""
        async with self._http().stream("POST", f"{base_url}/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                _json_or_raise(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise RemoteEngineError(f"the engine server failed: {event['error']}")
                for choice in event.get("choices", []):
                    yield choice


def _auth_headers(config: EngineConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.engine_api_key}"} if config.engine_api_key else {}


def _json_or_raise(response: httpx.Response) -> dict[str, Any]:
    if response.status_code == 200:
        try:
            return response.json() if response.content.strip() else {}
        except json.JSONDecodeError:
            return {"text": response.text}
    try:
        detail = response.json()
        detail = detail.get("error", {}).get("message") or detail.get("message") or detail
    except (json.JSONDecodeError, AttributeError):
        detail = response.text[:500]
    raise RemoteEngineError(f"the engine server answered {response.status_code} to {response.request.url.path}: {detail}")
