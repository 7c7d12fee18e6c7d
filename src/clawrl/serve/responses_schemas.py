"""Wire schemas of OpenAI's Responses API (`POST /v1/responses`): the request as agents send it.

Only the request is validated here; `responses_api.py` translates it onto the chat path and builds
the answer. What this server cannot honour is not dropped quietly: the schema leaves it out, so it
is refused with a 400 and the OpenAPI document says so (an image, file or audio input, tools OpenAI's
service runs, `background`, `truncation: "auto"`); a field that changes nothing a client can observe
is accepted and documented (`reasoning`, `include`, `parallel_tool_calls`, `metadata`). A forced tool
call, a JSON output format and a function tool's `strict` are honoured under a grammar
(serve/contract.py), or refused by an engine that cannot decode under one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from clawrl.serve.schemas import FORCING_CHOICE, checked_forced_call, forces_a_call


class _Loose(BaseModel):
    # agents send fields this server has no use for (an item's `id` and `status` from an earlier
    # response, a part's `annotations`): ignored, as OpenAI's own validation ignores unknown ones
    model_config = ConfigDict(extra="ignore")


class TextPart(_Loose):
    """Text in a message: `input_text` from the user, `output_text` echoed from an earlier answer."""

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None  # a `refusal` part's text

    @property
    def words(self) -> str:
        return self.text if self.text is not None else (self.refusal or "")


class MessageItem(_Loose):
    """A message of the conversation; `system` and `developer` are instructions to the model."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    # text only: the served model reads no image, file or audio part
    content: str | list[TextPart]


class FunctionCallItem(_Loose):
    """A call the model made in an earlier answer, echoed back by a client that keeps its own history."""

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str


class FunctionCallOutputItem(_Loose):
    """What the client's tool returned for `call_id`."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[TextPart]


def _item_type(value: Any) -> str:
    """An item's `type`; a message may leave it out (`{"role": "user", "content": "hi"}`)."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    # an unknown type is refused by the message model; tags are bracketed so that error paths leave
    # them out, as they leave out pydantic's own union-branch names (`errors.describe_validation_error`)
    return f"[{kind if kind in _ITEM_TYPES else 'message'}]"


# No `reasoning` items: these models write none, so no answer of this server gives a client one to echo
_ITEM_TYPES = ("message", "function_call", "function_call_output")
InputItem = Annotated[
    Annotated[MessageItem, Tag("[message]")] | Annotated[FunctionCallItem, Tag("[function_call]")]
    | Annotated[FunctionCallOutputItem, Tag("[function_call_output]")],
    Discriminator(_item_type),
]


class FunctionTool(_Loose):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(
        None, description="`true`: a call of it has arguments valid under `parameters` (decoded under a grammar, with "
        "`--engine hf` or `vllm`; `openai` refuses it with a 400)."
    )  # fmt: skip


class NamedFunction(_Loose):
    """`tool_choice` naming one function: the answer is a call of it."""

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=128)]


class TextFormat(_Loose):
    """`text.format`: plain text, any JSON object, or JSON valid under `schema` (decoded under a grammar,
    with `--engine hf` or `vllm`; refused with a 400 by `--engine openai`)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None
    description: str | None = None


class TextOptions(_Loose):
    format: TextFormat | None = None


_JSON_TEXT = {"type": "object", "required": ["format"], "properties": {"format": {
    "type": "object", "required": ["type"], "properties": {"type": {"enum": ["json_object", "json_schema"]}}}}}  # fmt: skip


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`, as the openai SDK, Codex CLI and the Agents SDK send it."""

    # what `_forced_calls_need_tools` checks, stated in the OpenAPI document
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"allOf": [
            {"anyOf": [{"properties": {"tool_choice": {"not": FORCING_CHOICE}}},
                       {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}]},
            {"anyOf": [{"properties": {"tool_choice": {"not": FORCING_CHOICE}}},
                       {"properties": {"text": {"not": _JSON_TEXT}}}]},
        ]},
    )  # fmt: skip

    model: Annotated[str, Field(min_length=1)]
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    # function tools only: web and file search, a computer and the like run on OpenAI's service
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = Field(
        None, description="`required` or a named function forces a call (decoded under a grammar, with `--engine hf` or `vllm`)."
    )
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    train: Annotated[bool, Field(description="clawrl: `false`: recorded, never judged nor trained on (as header X-Clawrl-Train); on a session's "
              "first request, for the whole session.")] = True
    background: Literal[False] | None = Field(None, description="Background responses are not offered.")
    text: TextOptions | None = None
    truncation: Literal["disabled"] | None = Field(None, description="An over-long conversation is refused, never cut.")
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None

    # field validators, so that the error names the field (`tools` and `tool_choice` are validated first)
    @field_validator("tool_choice")
    @classmethod
    def _forced_calls_need_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        return checked_forced_call(choice, info)

    @field_validator("text")
    @classmethod
    def _one_contract(cls, text: TextOptions | None, info: ValidationInfo) -> TextOptions | None:
        structured = text is not None and text.format is not None and text.format.type != "text"
        if structured and forces_a_call(info.data.get("tool_choice")):
            raise ValueError("a forced tool call (tool_choice) and a JSON text.format cannot both hold one answer; drop one")
        return text
