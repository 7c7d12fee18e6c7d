"""The environment protocol (DESIGN §9): what an environment is, and the records it exchanges.

An episode is an ordinary OpenAI chat conversation. `reset` opens it: its observation holds the
opening messages (system, then the user's task) and the tools the model may call, as OpenAI
function-tool schemas. Each action is one assistant message (content and/or `tool_calls`, the
arguments a JSON string, as OpenAI sends them); the step's observation holds the messages to
append after it (a `tool` message answering each call, by `tool_call_id`), so that
`opening + action + observation + action + ...` is the whole conversation.

Malformed actions, and who answers them:
- an action that is not an assistant message of this shape (a tool call without a function name,
  arguments that are not a string) is refused before it reaches the environment: over HTTP with a
  400, in a rollout by ending the episode as failed with `info["error"]`;
- a well-formed call the environment cannot run (an unknown tool, arguments that are not a JSON
  object, a missing or mistyped argument) is answered in-band: its tool message says what was
  wrong and the episode goes on, as a real tool runtime would answer (and as the judge expects to
  see a tool error: DESIGN §5).

An episode ends when the model answers without calling a tool, when it calls a tool that ends the
episode (the families document theirs), or at the step limit; the final step carries the outcome
reward, every other step reward 0.

The OpenEnv HTTP bodies (`ResetRequest`, `StepResponse`, ...) are here too, beside the records
they carry; `http.py` serves and drives them.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clawrl.types import ToolSpec
from clawrl.wire import ChatMessage, ToolCall

Split = Literal["train", "eval"]


# --- chat records ---------------------------------------------------------------------------------


class Action(BaseModel):
    """The model's move: one assistant message, stricter than the chat vocabulary allows: every
    call has an id (its answer names it) and its arguments as JSON text, as models emit them."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = Field("assistant", description="Always `assistant`.")
    content: str | None = Field(None, description="The assistant's text; the final answer when it calls no tool.")
    tool_calls: list[ToolCall] = Field(default_factory=list, description="The tools it calls, answered in order.")

    @field_validator("tool_calls")
    @classmethod
    def _calls_as_models_emit_them(cls, calls: list[ToolCall]) -> list[ToolCall]:
        for call in calls:
            if not call.id:
                raise ValueError("every tool call needs an id")
            if not isinstance(call.function.arguments, str):
                raise ValueError("a tool call's arguments must be JSON text (a string)")
        return calls

    def to_message(self) -> ChatMessage:
        return ChatMessage(role="assistant", content=self.content, tool_calls=self.tool_calls or None)


class Observation(BaseModel):
    """What the model sees next: messages to append to the conversation (and, at reset, its tools)."""

    messages: list[ChatMessage] = Field(description="Messages to append, in order.")
    tools: list[ToolSpec] = Field(
        default_factory=list, description="OpenAI function-tool schemas the model may call (sent at reset)."
    )


class StepResult(BaseModel):
    """What a step returns: the next observation, the step's reward, and whether the episode is over."""

    observation: Observation = Field(description="Messages answering the action.")
    reward: float = Field(0.0, description="The outcome reward on the final step, otherwise 0.")
    done: bool = Field(False, description="The episode is over; reset to start another.")
    info: dict[str, Any] = Field(
        default_factory=dict, description="Diagnostics for logs and records (never shown to the model)."
    )


class EpisodeState(BaseModel):
    """Where an episode stands (OpenEnv's `State`: `episode_id` and `step_count`, plus ours)."""

    episode_id: str | None = Field(None, description="The episode's identifier.")
    step_count: int = Field(0, ge=0, description="Steps taken in the episode.")
    task: str | None = Field(None, description="The task the episode works on.")
    done: bool = Field(False, description="Whether the episode is over.")
    reward: float = Field(0.0, description="The reward so far (the outcome, once done).")


class EpisodeOverError(Exception):
    """A step without an episode in progress (none was started, or it already ended)."""


class Environment(abc.ABC):
    """An environment runs one episode at a time; open several for parallel episodes."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def tasks(self, split: Split) -> list[str]:
        """The task ids of a split; train and eval never share a task."""

    @abc.abstractmethod
    async def reset(self, seed: int, task: str | None = None) -> Observation:
        """Start a new episode on `task` (or one chosen by `seed`); ends any episode in progress."""

    @abc.abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Answer the model's action; raises EpisodeOverError when no episode is in progress."""

    @abc.abstractmethod
    async def state(self) -> EpisodeState:
        """The current episode's state."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the environment holds (its sandbox); it can be reset again afterwards."""


# --- OpenEnv's HTTP bodies (http.py) ---------------------------------------------------------------


class ResetRequest(BaseModel):
    """`POST /reset`: OpenEnv's `{seed, episode_id}`, plus the task to open (our extension)."""

    model_config = ConfigDict(extra="allow")  # OpenEnv passes unknown fields on to the environment

    seed: int | None = Field(None, ge=0, description="Seed of the episode; picks the task when none is named.")
    episode_id: str | None = Field(
        None, max_length=255, description="Identifier of the new episode; steps name it. Generated when absent."
    )
    task: str | None = Field(None, description="Task id to open (GET /tasks lists them).")


class StepRequest(BaseModel):
    """`POST /step`: OpenEnv's `{action}`, plus the episode it belongs to (our extension)."""

    model_config = ConfigDict(extra="allow")

    action: dict[str, Any] = Field(description="The action: for clawrl environments an assistant message.")
    episode_id: str | None = Field(
        None, max_length=255, description="The episode to step; the most recently reset one when absent."
    )


class EnvResponse(BaseModel):
    """OpenEnv's reply to `/reset` and `/step`: `{observation, reward, done, metadata}`."""

    observation: dict[str, Any] = Field(description="The observation as JSON.")
    reward: float | None = Field(None, description="The step's reward (none at reset).")
    done: bool = Field(False, description="Whether the episode is over.")
    metadata: dict[str, Any] | None = Field(None, description="The step's info, and the episode's id.")


class CloseRequest(BaseModel):
    """`POST /close` (our extension): end an episode and release its sandbox now."""

    episode_id: str = Field(max_length=255, description="The episode to close.")


class SchemaResponse(BaseModel):
    """`GET /schema`: JSON schemas of the action, the observation and the state (as OpenEnv)."""

    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]
