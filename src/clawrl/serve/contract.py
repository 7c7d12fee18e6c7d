"""The request contract a chat body states beyond its messages, turned into the grammar that holds the
answer to it: `response_format` (a JSON object, or JSON valid under a schema) and `tool_choice`
(`required`: some tool call; a named function: a call of it).

What the wire schema can state it checks (a forced call needs tools; not both at once); what only
the grammar can tell is refused here for what the request names, with its own codes (the OpenAPI
fuzz lets these through, as it does a 404 for an unknown turn): a function that is not among the
tools (`unknown_tool`), a schema the grammar library cannot enforce (`unsupported_schema`).

Honoured or refused, never ignored: the hf engine and the vLLM server clawrl runs decode under the
grammar; an engine without constrained decoding (`--engine openai`: a server whose grammar backend
clawrl cannot know) refuses such a request with a 400 rather than answer free text that breaks the
client. The Responses and Messages routes translate their own fields (`text.format`, `tool_choice`
`any`/`tool`) into these.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from clawrl.errors import APIError
from clawrl.model.constraints import GrammarError, json_output_grammar, tool_call_grammar
from clawrl.serve import schemas

# the codes of the refusals for what a request names (see the module docstring)
REFUSED_FOR_WHAT_IT_NAMES = ("unknown_tool", "unsupported_schema")


def request_grammar(request: schemas.ChatCompletionRequest, tools: list[dict[str, Any]] | None,
                    tokenizer: PreTrainedTokenizerBase, engine_can: bool) -> str | None:  # fmt: skip
    """The grammar the answer must follow, or None; APIError 400 when it cannot be honoured."""
    forced = schemas.forces_a_call(request.tool_choice)
    structured = request.response_format is not None and request.response_format.type != "text"
    if not forced and not structured:
        return None
    param = "tool_choice" if forced else "response_format"
    if not engine_can:
        raise APIError(400, f"This {param} needs constrained decoding, which this server's engine does not offer; "
                       "serve with --engine hf or --engine vllm, or leave it out.", "unsupported_constraint", param)  # fmt: skip
    try:
        if forced:
            name = request.tool_choice.function.name if isinstance(request.tool_choice, schemas.NamedToolChoice) else None
            return tool_call_grammar(tokenizer, tools or [], name)
        return json_output_grammar(_schema_of(request.response_format))
    except GrammarError as error:
        code = "unknown_tool" if forced else "unsupported_schema"
        raise APIError(400, f"The {param} cannot be honoured: {error}.", code, param) from None


def _schema_of(response_format: schemas.ResponseFormat | None) -> dict[str, Any] | None:
    if response_format is None or response_format.type == "json_object" or response_format.json_schema is None:
        return None
    return response_format.json_schema.schema_ or {}
