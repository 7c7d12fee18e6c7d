"""Wire schemas of Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`),
kept apart from the serving logic (serve/messages_api.py), as serve/schemas.py is for chat.

A request is read as Anthropic documents it and then translated onto the chat path, so these
models accept only what that translation can honour. What it cannot (image and document blocks,
server tools, extended thinking, `top_k`, an assistant prefill, a forced tool call together with
structured outputs) is refused with a sentence that says so, never silently dropped. A forced tool
call, strict tools and structured outputs (`output_config.format`) are held by a grammar
(serve/contract.py). Fields this version does not know (`cache_control`, `service_tier`, ...) are
ignored, as the chat schema ignores OpenAI's.

Every class is named `Anthropic...`: the OpenAPI document names its component schemas by class
name, in one namespace with the chat API's (`Tool`, `Usage`, `ErrorResponse`, ...).

The models document the API too (`GET /openapi.json`), so the JSON schema of each states the
rules its validators check, except for the one JSON Schema cannot express: a `/v1/messages`
request must end with a user message (said in its description).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from clawrl.wire import WireModel

# --- request: content blocks -----------------------------------------------------------------------

# What no text-only chat path can take: named in the refusal, so the client knows it is not a typo
_UNSUPPORTED_BLOCK_REASONS = {
    "image": "this server serves a text-only model",
    "document": "this server serves a text-only model",
    "thinking": "extended thinking is not supported",
    "redacted_thinking": "extended thinking is not supported",
}


def _block_types(*accepted: str) -> BeforeValidator:
    """A content block of a type not in `accepted` is refused with a sentence naming the type (pydantic's
    own wording lists the tags it expected, which reads as if the client had made a typo)."""

    def check(value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in accepted:
            reason = _UNSUPPORTED_BLOCK_REASONS.get(kind, "this server translates Messages onto a text chat")
            raise ValueError(f"content blocks of type '{kind}' are not supported here ({reason}); accepted: {', '.join(accepted)}")
        return value

    return BeforeValidator(check)


class AnthropicTextBlockParam(WireModel):
    type: Literal["text"]
    text: str


class AnthropicToolUseBlockParam(WireModel):
    """An earlier answer's tool call (in an assistant message)."""

    type: Literal["tool_use"]
    id: str
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]


# the text of a tool's result (its images are refused, as everywhere)
_ToolResultText = Annotated[AnthropicTextBlockParam, _block_types("text")]


class AnthropicToolResultBlockParam(WireModel):
    """A tool's result (in a user message), answering the tool call `tool_use_id`."""

    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[_ToolResultText] = ""
    is_error: bool = Field(False, description="The tool failed: its text is given to the model after `Error: `.")


AnthropicUserBlock = Annotated[
    AnthropicTextBlockParam | AnthropicToolResultBlockParam, Field(discriminator="type"), _block_types("text", "tool_result")
]
AnthropicAssistantBlock = Annotated[
    AnthropicTextBlockParam | AnthropicToolUseBlockParam, Field(discriminator="type"), _block_types("text", "tool_use")
]


class AnthropicUserMessageParam(WireModel):
    role: Literal["user"]
    content: str | list[AnthropicUserBlock]


class AnthropicAssistantMessageParam(WireModel):
    """An earlier answer: its text and tool calls."""

    role: Literal["assistant"]
    content: str | list[AnthropicAssistantBlock]


class AnthropicSystemMessageParam(WireModel):
    """A system message in the conversation (Claude Code's mid-conversation system turns: its
    environment, tool and skill sections after the user's first message): a chat system message there."""

    role: Literal["system"]
    content: str | list[Annotated[AnthropicTextBlockParam, _block_types("text")]]


AnthropicMessageParam = Annotated[
    AnthropicUserMessageParam | AnthropicAssistantMessageParam | AnthropicSystemMessageParam, Field(discriminator="role")
]

# --- request: tools, tool choice, thinking, metadata -----------------------------------------------


class AnthropicToolParam(WireModel):
    """A client tool. Anthropic's server tools (`web_search_...`, `bash_...`, ...) run on Anthropic's
    side, which this server cannot do: they are refused."""

    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: bool | None = Field(
        None, description="`true`: a call of it has an `input` valid under `input_schema` (decoded under a grammar, with "
        "`--engine hf` or `vllm`; `openai` refuses it with a 400)."
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "custom":
            raise ValueError(f"server tools (type '{kind}') are not supported here; define a client tool with an input_schema")
        return value


class AnthropicToolChoiceParam(WireModel):
    """`auto`, `none`, `any` (some tool call) or `tool` (a call of the one `name`d). The last two force a
    call, decoded under a grammar with `--engine hf` or `vllm` (`openai` refuses them with a 400).
    `disable_parallel_tool_use` is accepted but not enforced (as the chat API's `parallel_tool_calls`)."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"properties": {"type": {"enum": ["auto", "none", "any"]}}},
                                     {"required": ["name"], "properties": {"name": {"type": "string"}}}]}  # fmt: skip
    )

    type: Literal["auto", "none", "any", "tool"]
    name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _tool_names_one(self) -> AnthropicToolChoiceParam:
        if self.type == "tool" and self.name is None:
            raise ValueError("tool_choice 'tool' needs the tool's name")
        return self


class AnthropicThinkingParam(WireModel):
    """Extended thinking: `disabled`, or `adaptive` (the model decides whether to think; this one never
    does, so the answer has no thinking blocks, as an adaptive answer may). `enabled` asks for thinking
    blocks, which the served model's reasoning is not split out as: refused."""

    type: Literal["disabled", "adaptive"]
    display: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _disabled_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in ("disabled", "adaptive"):
            raise ValueError(f"extended thinking ('{kind}') is not supported here; leave `thinking` out or disable it")
        return value


class AnthropicJSONOutputFormatParam(WireModel):
    """Structured outputs: the answer's text is JSON valid under `schema` (the chat API's `json_schema`
    response format)."""

    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class AnthropicOutputConfigParam(WireModel):
    """`effort` is accepted and has no effect; a `format` holds the answer to a JSON schema (decoded under
    a grammar, with `--engine hf` or `vllm`; `openai` refuses it with a 400)."""

    effort: str | None = None
    format: AnthropicJSONOutputFormatParam | None = None


class AnthropicMetadataParam(WireModel):
    user_id: Annotated[
        str | None,
        Field(max_length=256, description="Names the session (`user:<user_id>`), as the chat API's `user` does."),
    ] = None


# --- requests ----------------------------------------------------------------------------------------


class AnthropicCountTokensRequest(WireModel):
    """`POST /v1/messages/count_tokens`: the prompt's length in tokens, as `/v1/messages` would render it."""

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[AnthropicMessageParam], Field(min_length=1)]
    system: str | list[Annotated[AnthropicTextBlockParam, _block_types("text")]] | None = None
    tools: list[AnthropicToolParam] | None = None
    tool_choice: AnthropicToolChoiceParam | None = None
    thinking: AnthropicThinkingParam | None = None
    output_config: AnthropicOutputConfigParam | None = None


# A `tool_choice` that forces a call, and an `output_config` with a format, as JSON Schema
_FORCING_CHOICE = {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["any", "tool"]}}}
_WITH_FORMAT = {"type": "object", "required": ["format"], "properties": {"format": {"type": "object"}}}


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    """`POST /v1/messages`: Anthropic's Messages API, answered through the chat path (the same
    recording, sessions and judging as `/v1/chat/completions`).

    The last message must be the user's: an assistant message there asks Anthropic's API to continue
    it (a prefill), which the chat path cannot do. A `tool_choice` that forces a call needs tools, and
    leaves no text for an `output_config.format` to hold (refused, as the chat API refuses both).
    """

    # what `_forced_calls_need_tools` and `_one_contract` check, stated in the OpenAPI document
    model_config = ConfigDict(
        json_schema_extra={"allOf": [
            {"anyOf": [{"properties": {"tool_choice": {"not": _FORCING_CHOICE}}},
                       {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}]},
            {"anyOf": [{"properties": {"tool_choice": {"not": _FORCING_CHOICE}}},
                       {"properties": {"output_config": {"not": _WITH_FORMAT}}}]},
        ]}
    )  # fmt: skip

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[
        list[str], Field(max_length=4, description="At most 4, as the chat API's `stop`.")
    ] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: None = Field(None, description="Not supported (the engines sample with temperature and top_p): must be left out.")
    stream: bool = False
    metadata: AnthropicMetadataParam | None = None
    # clawrl extensions, as in the chat request (the same as headers, for clients that cannot set headers)
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
    store: Annotated[bool, Field(description="clawrl: `false`: answered, never recorded (no session, no turn), as "
                                 "OpenAI's `store`.")] = True
    train: Annotated[bool, Field(description="clawrl: `false`: recorded, never judged nor trained on (as header X-Clawrl-Train); on a session's "
              "first request, for the whole session.")] = True

    @field_validator("top_k", mode="before")
    @classmethod
    def _no_top_k(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("top_k is not supported here (the engines sample with temperature and top_p); leave it out")

    @field_validator("messages")
    @classmethod
    def _ends_with_user(cls, messages: list[Any]) -> list[Any]:
        said = [message for message in messages if message.role != "system"]  # a system message may follow the user's
        if not said or said[-1].role != "user":
            raise ValueError(
                "the last message must be the user's: continuing a final assistant message (a prefill) is not supported here"
            )
        return messages

    @field_validator("tool_choice")
    @classmethod
    def _forced_calls_need_tools(cls, choice: AnthropicToolChoiceParam | None, info: ValidationInfo) -> AnthropicToolChoiceParam | None:
        if choice is not None and choice.type in ("any", "tool") and not info.data.get("tools"):
            raise ValueError(f"tool_choice '{choice.type}' forces a tool call, but the request has no tools")
        return choice

    @field_validator("output_config")
    @classmethod
    def _one_contract(cls, config: AnthropicOutputConfigParam | None, info: ValidationInfo) -> AnthropicOutputConfigParam | None:
        choice = info.data.get("tool_choice")
        if config is not None and config.format is not None and choice is not None and choice.type in ("any", "tool"):
            raise ValueError("a forced tool call (tool_choice) and structured outputs (output_config.format) cannot both "
                             "hold one answer; drop one")  # fmt: skip
        return config


# --- answers -----------------------------------------------------------------------------------------


class AnthropicTextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class AnthropicToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


AnthropicContentBlock = Annotated[AnthropicTextBlock | AnthropicToolUseBlock, Field(discriminator="type")]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class AnthropicMessage(BaseModel):
    """The answer (and, with empty content and no stop reason yet, a stream's `message_start`)."""

    id: str = Field(description="The recorded turn's id (as the X-Clawrl-Turn header).")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[AnthropicContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = Field(description="The stop sequence that ended the answer, when one did.")
    usage: AnthropicUsage


class AnthropicTokenCount(BaseModel):
    input_tokens: int


# --- a stream's events -------------------------------------------------------------------------------


class AnthropicMessageStartEvent(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: AnthropicMessage


class AnthropicPingEvent(BaseModel):
    type: Literal["ping"] = "ping"


class AnthropicContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: AnthropicContentBlock


class AnthropicTextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class AnthropicInputJsonDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class AnthropicContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Annotated[AnthropicTextDelta | AnthropicInputJsonDelta, Field(discriminator="type")]


class AnthropicContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class AnthropicMessageDelta(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class AnthropicDeltaUsage(BaseModel):
    output_tokens: int


class AnthropicMessageDeltaEvent(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: AnthropicMessageDelta
    usage: AnthropicDeltaUsage


class AnthropicMessageStopEvent(BaseModel):
    type: Literal["message_stop"] = "message_stop"


# --- the error object ------------------------------------------------------------------------------

AnthropicErrorType = Literal[
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error", "request_too_large",
    "rate_limit_error", "api_error", "overloaded_error",
]  # fmt: skip


class AnthropicErrorDetail(BaseModel):
    type: AnthropicErrorType
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every refusal of these routes, as Anthropic's API sends it (and a stream's `error` event)."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


# What a stream sends, in order: (event name, the model of its data)
STREAM_EVENTS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("message_start", AnthropicMessageStartEvent),
    ("ping", AnthropicPingEvent),
    ("content_block_start", AnthropicContentBlockStartEvent),
    ("content_block_delta", AnthropicContentBlockDeltaEvent),
    ("content_block_stop", AnthropicContentBlockStopEvent),
    ("message_delta", AnthropicMessageDeltaEvent),
    ("message_stop", AnthropicMessageStopEvent),
    ("error", AnthropicErrorResponse),
)
