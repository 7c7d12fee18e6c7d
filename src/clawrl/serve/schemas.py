"""Wire schemas of the OpenAI-compatible API (pydantic), kept apart from the serving logic.

Unknown request fields are ignored rather than rejected: real agents send many optional
parameters (`parallel_tool_calls`, `store`, `metadata`, ...) that do not change generation here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text", "input_text"]
    text: str


class FunctionCall(_Lenient):
    name: Annotated[str, Field(min_length=1)]
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> ChatMessage:
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages may carry tool_calls")
        return self


class FunctionDefinition(_Lenient):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
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
    # clawrl extensions (the same as headers, for clients that cannot set headers)
    session_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    turn_type: Literal["main", "side"] | None = None
    session_done: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_as_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self


class FeedbackRequest(_Lenient):
    session_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    turn: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    score: Annotated[int, Field(strict=True)]  # strict: `true` or `1.0` are not a thumbs up
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


class EpisodeStartRequest(_Lenient):
    """`POST /v1/episodes`: register an episode before its first step (its session id names it)."""

    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    env: Annotated[str, Field(min_length=1, max_length=64)]
    task: Annotated[str, Field(min_length=1, max_length=256)]
    group_id: Annotated[str, Field(min_length=1, max_length=128)]
    group_size: Annotated[int, Field(strict=True, ge=1, le=4096)]
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]  # the store keeps a 32-bit integer


class EpisodeResultRequest(_Lenient):
    """`POST /v1/episodes/{session_id}/result`: how an episode ended.

    `final_observation` is what the environment answered to the last step (its tool messages): no
    later chat request carries it, so it is recorded as that step's next state from here.
    """

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
    content: str | None
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
