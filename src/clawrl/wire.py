"""The chat vocabulary every HTTP surface of clawrl speaks: OpenAI's message, tool call and function call.

Defined once. The OpenAI-compatible server (`serve/schemas.py`) parses clients' requests with it;
the environment protocol (`envs/protocol.py`) builds an episode's messages and parses the model's
actions with it. It is lenient where real clients differ (unknown fields are ignored, a tool call
may come without an id, arguments as an object rather than JSON text); a surface that needs more
narrows it with a validator of its own (an environment's action: an id on every call, arguments as
JSON text).

A message is parsed as one model, whose errors say which field a role misses; its JSON schema
(in `GET /openapi.json`) is the role-specific shapes, which accept exactly what the validator does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


class WireModel(BaseModel):
    """A body part as clients send it: fields this version does not know are ignored."""

    model_config = ConfigDict(extra="ignore")


class TextPart(WireModel):
    """One text part of a message's content (the array form of `content`)."""

    type: Literal["text", "input_text"]
    text: str


class FunctionCall(WireModel):
    """The function half of a tool call; `arguments` is JSON text, as models emit it (some clients
    send the object itself)."""

    name: Annotated[str, Field(min_length=1, description="Name of the tool to call.")]
    arguments: str | dict[str, Any] = Field("{}", description="The arguments: a JSON object, usually serialised to a string.")


class ToolCall(WireModel):
    """One tool call of an assistant message."""

    id: str | None = Field(None, description="Identifier the tool's answer refers to (`tool_call_id`).")
    type: Literal["function"] = Field("function", description="Always `function`.")
    function: FunctionCall = Field(description="The tool and its arguments.")


Content = str | list[TextPart]
# Only assistant messages carry tool calls: other roles may send none, an empty list or null
_NoToolCalls = Annotated[list[Any], Field(max_length=0)] | None


class SystemMessage(WireModel):
    """Instructions (`developer` is read as `system`)."""

    role: Literal["system", "developer"]
    content: Content
    name: str | None = None
    tool_calls: _NoToolCalls = None
    tool_call_id: str | None = None


class UserMessage(WireModel):
    role: Literal["user"]
    content: Content
    name: str | None = None
    tool_calls: _NoToolCalls = None
    tool_call_id: str | None = None


class AssistantMessage(WireModel):
    """An earlier answer, as text (and possibly tool calls)."""

    role: Literal["assistant"]
    content: Content
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class AssistantToolCallsMessage(WireModel):
    """An earlier answer that called tools, with or without text."""

    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)]
    tool_call_id: str | None = None


class ToolMessage(WireModel):
    """A tool's result, answering the assistant's call `tool_call_id`."""

    role: Literal["tool"]
    content: Content
    name: str | None = None
    tool_calls: _NoToolCalls = None
    tool_call_id: Annotated[str, Field(min_length=1)]


_MESSAGE_SHAPES = (SystemMessage, UserMessage, AssistantMessage, AssistantToolCallsMessage, ToolMessage)


class ChatMessage(WireModel):
    """One message. Parsed leniently as one model (its errors say which field a role misses); its
    JSON schema is the role-specific shapes above, which accept exactly what the validator does."""

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

    def to_openai(self) -> dict[str, Any]:
        """The message as OpenAI's API takes it (unset fields left out)."""
        return self.model_dump(exclude_none=True)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [handler(shape.__pydantic_core_schema__) for shape in _MESSAGE_SHAPES], "title": "ChatMessage"}
