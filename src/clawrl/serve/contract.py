"""The request contract a chat body states beyond its messages, turned into the grammar that holds the
answer to it: `response_format` (a JSON object, or JSON valid under a schema), `tool_choice`
(`required`: some tool call; a named function: a call of it) and a function tool's `strict` (a call
of it, when the model chooses to make one, has arguments valid under its parameters).

Which grammar, by what the request asks:

* a forced call: exactly one call, of any tool (or the named one), held to its schema, strict or not;
* `tool_choice` `auto` (or absent) with a strict tool: free text, or text and then calls (a lazy
  grammar, `text_or_calls_grammar`), each strict tool's arguments held to its schema;
* a JSON `response_format` and tools the model may call (`auto`): the JSON answer, or calls
  (`json_or_calls_grammar`): an agent with a structured output still calls its tools first;
* a JSON `response_format` alone, or with `tool_choice` `none`: the JSON answer;
* anything else (`auto` with no strict tool, `none`): no grammar, so an ordinary turn is decoded
  exactly as it would be without this module. Under `none` no call is ever parsed from the answer
  (`ChatService.start`), strict tools or not.

What the wire schema can state it checks (a forced call needs tools; not both at once); what only
the grammar can tell is refused here for what the request names, with its own codes (the OpenAPI
fuzz lets these through, as it does a 404 for an unknown turn): a function that is not among the
tools (`unknown_tool`), a schema the grammar library cannot enforce (`unsupported_schema`).

Honoured or refused, never ignored: the hf engine and the vLLM server clawrl runs decode under the
grammar; an engine without constrained decoding (`--engine openai`: a server whose grammar backend
clawrl cannot know) refuses such a request with a 400 rather than answer free text that breaks the
client, strict tools included (docs/serving.md says what that means for the Agents SDK, which marks
every tool strict). The Responses and Messages routes translate their own fields (`text.format`,
`output_config.format`, `tool_choice` `any`/`tool`, their tools' `strict`) into these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from clawrl.errors import APIError
from clawrl.model.constraints import (
    GrammarError,
    json_or_calls_grammar,
    json_output_grammar,
    text_or_calls_grammar,
    tool_call_grammar,
)
from clawrl.serve import schemas

# the codes of the refusals for what a request names (see the module docstring)
REFUSED_FOR_WHAT_IT_NAMES = ("unknown_tool", "unsupported_schema")
# what an engine without constrained decoding refuses, by the parameter that asks for it, and the way out
_NEEDS_A_GRAMMAR = {
    "tool_choice": ("This tool_choice", "leave it out"),
    "response_format": ("This response_format", "leave it out"),
    "tools": ("A strict tool (its calls held to its parameters)", "set its strict to false"),
}


def request_grammar(request: schemas.ChatCompletionRequest, tools: list[dict[str, Any]] | None,
                    tokenizer: PreTrainedTokenizerBase, engine_can: bool) -> str | None:  # fmt: skip
    """The grammar the answer must follow, or None; APIError 400 when it cannot be honoured.
    `tools`: the request's tools as the chat template renders them (`strict` is read off the request)."""
    forced = schemas.forces_a_call(request.tool_choice)
    structured = request.response_format is not None and request.response_format.type != "text"
    may_call = bool(tools) and request.tool_choice in (None, "auto")
    held = strict_tool_names(request) if may_call else set()
    if not (forced or structured or held):
        return None
    param = "tool_choice" if forced else ("response_format" if structured else "tools")
    if not engine_can:
        what, way_out = _NEEDS_A_GRAMMAR[param]
        raise APIError(400, f"{what} needs constrained decoding, which this server's engine does not offer; serve with "
                       f"--engine hf or --engine vllm, or {way_out}.", "unsupported_constraint", param)  # fmt: skip
    if forced:
        name = request.tool_choice.function.name if isinstance(request.tool_choice, schemas.NamedToolChoice) else None
        return _built(lambda: tool_call_grammar(tokenizer, tools or [], name), "tool_choice", "unknown_tool")
    if not structured:
        return _built(lambda: text_or_calls_grammar(tokenizer, tools or [], held), "tools", "unsupported_schema")
    schema = _schema_of(request.response_format)
    answer = _built(lambda: json_output_grammar(schema), "response_format", "unsupported_schema")
    if not may_call:
        return answer
    # the answer's schema compiled on its own above, so a failure here is a tool's
    return _built(lambda: json_or_calls_grammar(tokenizer, tools or [], held, schema), "tools", "unsupported_schema")


def strict_tool_names(request: schemas.ChatCompletionRequest) -> set[str]:
    """The names of the request's function tools marked `strict`."""
    return {tool.function.name for tool in request.tools or [] if tool.function.strict}


def _built(build: Callable[[], str], param: str, code: str) -> str:
    """`build()`'s grammar; its GrammarError as the 400 that names `param` with `code`."""
    try:
        return build()
    except GrammarError as error:
        raise APIError(400, f"The {param} cannot be honoured: {error}.", code, param) from None


def _schema_of(response_format: schemas.ResponseFormat | None) -> dict[str, Any] | None:
    if response_format is None or response_format.type == "json_object" or response_format.json_schema is None:
        return None
    return response_format.json_schema.schema_ or {}
