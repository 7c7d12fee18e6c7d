"""Wire schemas of the OpenAI-compatible API (pydantic), kept apart from the serving logic.

Unknown request fields are ignored rather than rejected: real agents send many optional
parameters (`parallel_tool_calls`, `store`, `metadata`, ...) that do not change generation here.

The same models document the API (`GET /openapi.json`, built in serve/openapi.py). Rules a model
checks in a validator (which fields a message of each role needs, `top_logprobs` needing
`logprobs`, ...) are stated in its JSON schema too, so that a request valid by the document is
never refused for its shape: tests/test_openapi_fuzz.py sends schema-generated requests to a real
server to hold the two together.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from clawrl.store.memory import MAX_NOTE_CHARS
from clawrl.wire import ChatMessage, WireModel


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as JSON Schema reads `"type": "integer"`: `1.0` is one (a strict int refused it, a
# request valid by the OpenAPI document), `true` and "1" are not (as a lax int would take them).
# The constraints come before the validator, so that the JSON schema states them.
_AsJsonInteger = BeforeValidator(_integral)


class FunctionDefinition(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # left out of a dump (the tools the chat template renders and the turn records): it is the
    # contract's, held by a grammar (serve/contract.py), and the prompt stays the one it was without it
    strict: bool | None = Field(
        None, exclude=True, description="A call of this tool has arguments valid under `parameters` (decoded under a grammar)."
    )


class Tool(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class JsonSchemaFormat(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(WireModel):
    """`response_format`: free text, any JSON object, or JSON valid under a schema (decoded under a grammar)."""

    # what `_schema_with_json_schema` checks: the `json_schema` type names its schema
    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"properties": {"type": {"enum": ["text", "json_object"]}}},
                                     {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}}]}
    )  # fmt: skip

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema response_format needs its json_schema (a name and a schema)")
        return self


# A `tool_choice` that forces a call, and a `response_format` that asks for JSON, as JSON Schema: the
# rules `ChatCompletionRequest._forced_calls_need_tools` checks, stated in the OpenAPI document.
FORCING_CHOICE = {"anyOf": [{"const": "required"}, {"type": "object"}]}
_STRUCTURED = {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}, "required": ["type"]}
FORCED_CALL_RULES = [
    # a forced call needs a tool to call
    {"anyOf": [{"properties": {"tool_choice": {"not": FORCING_CHOICE}}},
               {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}]},
    # one answer cannot be both a tool call and a JSON document
    {"anyOf": [{"properties": {"tool_choice": {"not": FORCING_CHOICE}}},
               {"properties": {"response_format": {"not": _STRUCTURED}}}]},
]  # fmt: skip


class FunctionName(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=128)]


class NamedToolChoice(WireModel):
    """`tool_choice` naming one function: the answer is a call of it."""

    type: Literal["function"]
    function: FunctionName


class StreamOptions(WireModel):
    include_usage: bool = False


class ChatCompletionRequest(WireModel):
    """`POST /v1/chat/completions`: OpenAI's chat schema and clawrl's session fields."""

    model_config = ConfigDict(
        extra="ignore",
        # what `_check_logprobs` checks: a positive `top_logprobs` needs `logprobs: true`
        json_schema_extra={
            "allOf": [
                {"anyOf": [
                    {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
                    {"properties": {"top_logprobs": {"enum": [0, None]}}},
                ]},
                *FORCED_CALL_RULES,
            ]
        },
    )  # fmt: skip

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    # int64, as OpenAI documents it; torch's generator raises (a 500) on seeds beyond 64 bits
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    user: Annotated[str, Field(max_length=256)] | None = None
    store: Annotated[bool, Field(description="`false`: answered, never recorded (no session, no turn). clawrl records by default, unlike OpenAI's API.")] = True
    # clawrl extensions (the same as headers, for clients that cannot set headers)
    session_id: Annotated[
        str | None,
        Field(min_length=1, max_length=256, description="clawrl: the session this turn belongs to (as header X-Session-Id)."),
    ] = None
    turn_type: Annotated[
        Literal["main", "side"] | None,
        Field(description="clawrl: `side` turns (titles, summaries) are served but never trained on (as header X-Turn-Type)."),
    ] = None
    session_done: Annotated[
        bool, Field(description="clawrl: this is the session's last turn (as header X-Session-Done).")
    ] = False
    train: Annotated[bool, Field(description="clawrl: `false`: recorded, never judged nor trained on (as header X-Clawrl-Train); on a session's "
              "first request, for the whole session.")] = True
    memory: Annotated[bool | None, Field(description="clawrl, with --memory on: whether the prompt carries the user's notes "
              "(as header X-Clawrl-Memory: on|off); unset: main turns do, side turns do not.")] = None

    @field_validator("stop")
    @classmethod
    def _stop_as_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    # field validators, so that the error names the field (`tools` and `tool_choice` are validated first)
    @field_validator("tool_choice")
    @classmethod
    def _forced_calls_need_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        return checked_forced_call(choice, info)

    @field_validator("response_format")
    @classmethod
    def _one_contract(cls, response_format: ResponseFormat | None, info: ValidationInfo) -> ResponseFormat | None:
        if response_format is not None and response_format.type != "text" and forces_a_call(info.data.get("tool_choice")):
            raise ValueError("a forced tool call (tool_choice) and a JSON response_format cannot both hold one answer; drop one")
        return response_format


def forces_a_call(choice: Any) -> bool:
    """Whether a validated `tool_choice` forces a call: `required`, or a named function (an object, in
    the Chat Completions and the Responses shapes alike)."""
    return choice == "required" or isinstance(choice, BaseModel)


def checked_forced_call(choice: Any, info: ValidationInfo) -> Any:
    """`tool_choice`, refused when it forces a call and the request (validated before it) has no tools."""
    if forces_a_call(choice) and not info.data.get("tools"):
        raise ValueError("tool_choice forces a tool call, but the request has no tools")
    return choice


class MemoryNoteRequest(WireModel):
    """`POST /v1/me/memory`: a note the caller adds to their memory (`--memory on` says it in their prompts)."""

    text: Annotated[
        str,
        Field(min_length=1, max_length=MAX_NOTE_CHARS, pattern=r"\S",
              description="What the model should remember about the caller: a sentence or three."),
    ]


class FeedbackRequest(WireModel):
    """`POST /v1/feedback`: a thumbs up or down on a turn (or on a session's last main turn)."""

    # what `_needs_target` checks: a turn or a session to attach the feedback to
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"properties": {"turn": {"type": "string"}}, "required": ["turn"]},
                {"properties": {"session_id": {"type": "string"}}, "required": ["session_id"]},
            ]
        },
    )

    session_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    turn: Annotated[
        str | None, Field(min_length=1, max_length=64, description="The X-Clawrl-Turn header of the answer.")
    ] = None
    # `true` or "1" are not a thumbs up
    score: Annotated[
        int,
        Field(strict=True, json_schema_extra={"enum": [1, -1]}, description="1 (thumbs up) or -1 (thumbs down)."),
        _AsJsonInteger,
    ]
    text: Annotated[str, Field(max_length=10_000)] | None = None

    @field_validator("score")
    @classmethod
    def _thumbs(cls, value: int) -> int:
        if value not in (1, -1):
            raise ValueError("score must be 1 (thumbs up) or -1 (thumbs down)")
        return value

    @model_validator(mode="after")
    def _needs_target(self) -> FeedbackRequest:
        if self.session_id is None and self.turn is None:
            raise ValueError("feedback needs a turn (the X-Clawrl-Turn of the answer) or a session_id")
        return self


# A finite reward: JSON has no NaN, but Python's parser reads `NaN` and `Infinity`
Reward = Annotated[float, Field(allow_inf_nan=False)]


class EpisodeStartRequest(WireModel):
    """`POST /v1/episodes`: register an episode before its first step (its session id names it)."""

    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    env: Annotated[str, Field(min_length=1, max_length=64)]
    task: Annotated[str, Field(min_length=1, max_length=256)]
    group_id: Annotated[str, Field(min_length=1, max_length=128)]
    group_size: Annotated[int, Field(strict=True, ge=1, le=4096), _AsJsonInteger]
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), _AsJsonInteger]  # the store keeps a 32-bit integer


class EpisodeResultRequest(WireModel):
    """`POST /v1/episodes/{session_id}/result`: how an episode ended.

    `final_observation` is what the environment answered to the last step (its tool messages): no
    later chat request carries it, so it is recorded as that step's next state from here.
    """

    # what `_finished_needs_reward` checks
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"properties": {"failed": {"const": True}}, "required": ["failed"]},
                {"properties": {"reward": {"type": "number"}}, "required": ["reward"]},
            ]
        },
    )

    failed: bool = False
    error: Annotated[str, Field(max_length=10_000)] | None = None
    reward: Reward | None = None
    step_rewards: Annotated[list[Reward], Field(max_length=10_000)] = []
    final_observation: Annotated[list[ChatMessage], Field(max_length=256)] = []

    @model_validator(mode="after")
    def _finished_needs_reward(self) -> EpisodeResultRequest:
        if not self.failed and self.reward is None:
            raise ValueError("a finished episode needs its outcome `reward` (or `failed: true`)")
        return self


# --- responses -------------------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class Logprobs(BaseModel):
    content: list[TokenLogprob]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None  # left out (exclude_none) when the answer is only tool calls
    tool_calls: list[dict[str, Any]] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    logprobs: Logprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: Logprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# --- the other endpoints' answers and the error object --------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every refusal, as OpenAI's API sends it (clawrl/errors.py)."""

    error: ErrorDetail


class FeedbackResponse(BaseModel):
    id: int
    turn: str
    score: Literal[1, -1]
    recorded: Literal[True] = True


class EpisodeStartResponse(BaseModel):
    session_id: str
    status: Literal["running"] = "running"


class EpisodeResultResponse(BaseModel):
    session_id: str
    status: Literal["finished", "failed"]
    recorded: Literal[True] = True


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TrainerStatus(BaseModel):
    running: bool
    pid: int | None
    restarts: int
    given_up: bool
    actor: str | None = None  # --placement ray: the trainer's Ray actor (its id) ...
    node: str | None = None  # ... and the address of the node it runs on


class JudgeActorStatus(TrainerStatus):
    """One judge actor (`--judge-actors`): as a trainer's actor, with the worker id its verdicts carry."""

    worker_id: str | None = None


class JudgeActorsStatus(BaseModel):
    actors: int  # --judge-actors
    alive: int
    restarts: int  # all actors together
    workers: list[JudgeActorStatus]


class ReplicaStatus(BaseModel):
    """One replica of `--replicas` (or of several `--engine-url`s)."""

    replica: int
    in_rotation: bool  # new requests go to it
    requests: int  # started on it
    restarts: int  # --placement ray: times its actor died and a new one came back into rotation
    given_up: bool  # its actor kept dying: it stays out


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    policy_version: int
    trainer: TrainerStatus | None = None  # only when the server runs a trainer
    judges: JudgeActorsStatus | None = None  # only with judge actors
    replicas: list[ReplicaStatus] | None = None  # only with several replicas


class Readiness(BaseModel):
    """`/readyz`: 200 when the model answers, the store answers and the served version is known; 503 otherwise."""

    status: Literal["ready", "not_ready"]
    model: str
    policy_version: int = Field(description="The version new requests are answered with.")
    published_version: int | None = Field(description="The store's serving pointer (null when the store did not answer).")
    problems: dict[str, str] = Field(description="What is not ready, by part (`model`, `store`, `policy`): empty when ready.")
