"""The typed OpenAPI document (`GET /openapi.json`): request bodies, answers and error objects.

The server reads request bodies itself (bodies.py's `read_json`: size limits first, then malformed
JSON and schema errors as OpenAI-style error objects), so FastAPI cannot infer the bodies from the
routes. Each route gets its documentation from here instead: `openapi_extra` names the request
model of schemas.py (and the chat route's header parameters), `responses` the answer and the
error object of each status the route can send, and `install` adds the request models' JSON
schemas to the document's components, names the served model, says how to send the API key when
there is one, and drops FastAPI's 422, which this server never sends (its validation errors are
400s). tests/test_openapi_fuzz.py checks the document against a real server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from clawrl.serve import schemas
from clawrl.serve.responses_schemas import ResponsesRequest

REF = "#/components/schemas/{model}"

# The request bodies (read by the routes themselves: validation mode), and what a stream's events
# carry (no route returns them as a model, so FastAPI would not document them)
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    schemas.ChatCompletionRequest,
    ResponsesRequest,
    schemas.FeedbackRequest,
    schemas.MemoryNoteRequest,
    schemas.EpisodeStartRequest,
    schemas.EpisodeResultRequest,
)
EVENT_MODELS: tuple[type[BaseModel], ...] = (schemas.ChatCompletionChunk, schemas.ErrorResponse)

_ERRORS = {
    400: "The request is malformed or invalid (the message says which field, `param` names it).",
    401: "Missing or invalid API key (when the server has one, or has users): send `Authorization: Bearer <key>` "
         "(or `x-api-key: <key>`).",
    403: "A user's key where the admin's is needed (episodes are the admin's).",
    404: "Not found (a turn or session of another user is not found either).",
    409: "Conflicts with what is recorded.",
    413: "The body is over the server's size limit (`--max-body-bytes`).",
}


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def errors(*statuses: int, why: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """The error object as the answer of each status; `why` says more about some of them."""
    why = why or {}
    return {status: {"model": schemas.ErrorResponse, "description": why.get(status, _ERRORS[status])} for status in statuses}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref(model)}}}}


def _header(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}


# One server-sent event of a streamed chat completion: OpenAPI 3.1 has no `itemSchema` (3.2), and
# tools such as schemathesis read a sequential media type's `schema` as one event of it
STREAM_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "anyOf": [
                {"type": "string", "contentMediaType": "application/json", "contentSchema": ref(schemas.ChatCompletionChunk)},
                {"const": "[DONE]"},
                # the engine failed mid-stream: said in-band, then `[DONE]`
                {"type": "string", "contentMediaType": "application/json", "contentSchema": ref(schemas.ErrorResponse)},
            ]
        },
        "event": {"type": "string"},
    },
}

CHAT_COMPLETIONS: dict[str, Any] = {
    "summary": "Create a chat completion",
    "description": (
        "OpenAI's chat completions, recorded as a turn of a session for training. The session is the "
        "`X-Session-Id` header, else the body's `session_id`, else `user`, else inferred from the "
        "conversation; the answer's headers name the recorded turn (for `POST /v1/feedback`)."
    ),
    "responses": {
        200: {
            "model": schemas.ChatCompletion,
            "description": "The answer: a chat completion, or with `stream: true` server-sent events, each a "
            "`chat.completion.chunk` as JSON, ending with `data: [DONE]`.",
            "content": {"text/event-stream": {"schema": STREAM_EVENT}},
            "headers": {
                "X-Clawrl-Turn": {"required": True, "schema": {"type": "string"}, "description": "The recorded turn's id."},
                "X-Clawrl-Session": {
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "Its session's id, percent-encoded (UTF-8) where it has characters other than "
                    "printable ASCII or has `%`.",
                },
                "X-Clawrl-Policy-Version": {
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                    "description": "The policy version that generated the answer.",
                },
                "X-Clawrl-Turn-Kind": {"required": True, "schema": {"type": "string", "enum": ["main", "side"]}},
            },
        },
        **errors(400, 401, 404, 413, why={404: "The `model` is not the one this server serves."}),
    },
    "openapi_extra": {
        **request_body(schemas.ChatCompletionRequest),
        "parameters": [
            _header("X-Session-Id", {"type": "string", "maxLength": 256}, "The session this turn belongs to."),
            _header(
                "X-Turn-Type",
                {"type": "string", "enum": ["main", "side"]},
                "`side` turns (titles, summaries) are served but never trained on; the default is `main`.",
            ),
            _header("X-Session-Done", {"type": "string"}, "`true` (or `1`, `yes`, `on`): the session's last turn."),
            _header("X-Clawrl-Train", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]},
                    "`false` (or `0`, `no`, `off`): recorded, never judged nor "
                    "trained on; on a session's first request, for the whole session (as the body's `train`)."),
            _header("X-Clawrl-Memory", {"type": "string", "enum": ["on", "off", "true", "false", "1", "0", "yes", "no"]},
                    "With --memory on: `on` or `off`, whether the prompt carries the user's memory notes (as the "
                    "body's `memory`); unset: main turns do, side turns do not."),
        ],
    },
}

FEEDBACK: dict[str, Any] = {
    "summary": "Rate an answer",
    "description": "A thumbs up or down (and optionally a correction) on a turn, which outranks the judge's score.",
    "responses": errors(400, 401, 404, 413, why={404: "No such turn, or the session has no recorded main turn."}),
    "openapi_extra": request_body(schemas.FeedbackRequest),
}

SESSIONS: dict[str, Any] = {
    "summary": "List your sessions",
    "description": "The caller's most recently active sessions (the admin's key: everyone's), newest first.",
    "responses": errors(400, 401),
}

SESSION: dict[str, Any] = {
    "summary": "Read a session",
    "description": "One of the caller's sessions with every turn: its new input, answer, next state, verdict, "
    "feedback and sample. The id is the one `X-Clawrl-Session` names, or the name the caller gave it.",
    "responses": errors(401, 404, why={404: "No such session of the caller's."}),
}

ME_DATA: dict[str, Any] = {
    "summary": "Export your records",
    "description": "Every main turn of the caller's sessions as JSON lines, one per turn in arrival order, the "
    "format of `clawrl export` (`opt_out` says why a turn is never trained on). A user's key only.",
    "responses": {
        200: {"description": "JSON lines.", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}},
        **errors(400, 401, why={400: "The admin's key: it has no records of its own (use `clawrl export`, or "
                                "`clawrl users export NAME`)."}),
    },
}

ME_DATA_DELETE: dict[str, Any] = {
    "summary": "Forget your records",
    "description": "Removes every record of the caller's (sessions, turns, next states, verdicts, samples, "
    "episodes, feedback, hints) and, with `--adapters per-user`, their own lineage's versions, from the store "
    "and the disk. The account and its key stay: the next request starts again from the base model. Answers "
    "what was removed, per table; `shared_versions_trained_on_user` lists the shared lineage's versions whose "
    "steps trained on the caller's samples: their weights keep that influence. A user's key only.",
    "responses": {
        200: {"description": "What was removed.", "content": {"application/json": {"schema": {"type": "object"}}}},
        **errors(400, 401, why={400: "The admin's key: it has no records of its own (`clawrl users forget NAME` "
                                "forgets a user)."}),
    },
}

_NOTES = {"description": "The caller's notes.", "content": {"application/json": {"schema": {"type": "object"}}}}
ME_MEMORY: dict[str, Any] = {
    "summary": "List your memory notes",
    "description": "The notes kept for the caller (the admin's key, or no key: the run's, made without a user's "
    "key), oldest first: the judge's chosen hints and feedback texts (`--memory on`) and notes added here. With "
    "`--memory on` the newest `--memory-notes` active ones are appended to the system prompt of the caller's main "
    "turns; a note with `retired_at` set (`--memory-retire`: the weights follow it unprompted) is kept but no longer "
    "appended, until it is taught or edited again.",
    "responses": {200: _NOTES, **errors(401)},
}
ME_MEMORY_ADD: dict[str, Any] = {
    "summary": "Add a memory note",
    "description": "Keeps `text` as the caller's newest note (a note already kept, compared without case, spacing "
    "and closing punctuation, becomes the newest instead of being repeated); past `--memory-notes` the oldest goes.",
    "responses": {200: {"description": "The note kept.", "content": {"application/json": {"schema": {"type": "object"}}}},
                  **errors(400, 401, 413)},
    "openapi_extra": request_body(schemas.MemoryNoteRequest),
}
ME_MEMORY_EDIT: dict[str, Any] = {
    "summary": "Edit a memory note",
    "description": "Replaces the text of one of the caller's notes: it keeps its id and its place among the notes, "
    "becomes the caller's own (`source` \"user\") and the newest.",
    "responses": {200: {"description": "The note as it reads now.", "content": {"application/json": {"schema": {"type": "object"}}}},
                  **errors(400, 401, 404, 409, 413, why={404: "The caller has no note with this id.",
                                                          409: "Another note of the caller's says that already."})},
    "openapi_extra": request_body(schemas.MemoryNoteRequest),
}
ME_MEMORY_REMOVE: dict[str, Any] = {
    "summary": "Remove one memory note",
    "responses": {200: {"description": "The note is gone.", "content": {"application/json": {"schema": {"type": "object"}}}},
                  **errors(400, 401, 404, why={400: "The id is not a number.", 404: "The caller has no note with this id."})},
}

EPISODE_START: dict[str, Any] = {
    "summary": "Register an episode",
    "description": "Registers an environment episode before its first step; its steps are chat turns of its session.",
    "responses": errors(400, 401, 403, 409, 413, why={409: "An episode with this `session_id` is already registered."}),
    "openapi_extra": request_body(schemas.EpisodeStartRequest),
}

EPISODE_RESULT: dict[str, Any] = {
    "summary": "Report how an episode ended",
    "responses": errors(
        400,
        401,
        403,
        404,
        409,
        413,
        why={404: "No episode with this session id is registered.", 409: "The episode has already ended."},
    ),
    "openapi_extra": request_body(schemas.EpisodeResultRequest),
}

MODELS: dict[str, Any] = {"summary": "List the served model", "responses": errors(401)}
HEALTHZ: dict[str, Any] = {"summary": "Health, model and policy version"}
READYZ: dict[str, Any] = {
    "summary": "Readiness: the model answers, the store answers, the served version is known",
    "responses": {503: {"description": "Not ready; `problems` says why.", "model": schemas.Readiness}},
}
METRICS: dict[str, Any] = {
    "summary": "Prometheus metrics",
    "responses": {200: {"description": "Prometheus' text format.", "content": {"text/plain": {"schema": {"type": "string"}}}}},
}


def install(app: FastAPI, served_model: str, api_key: bool) -> None:
    """Make `app.openapi()` (and `GET /openapi.json`) the typed document of this server: its
    `model` is the one it serves (any other is a 404), its /v1 routes need a key if it has one."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _typed(generate(), served_model, api_key)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def component_schemas() -> dict[str, Any]:
    """The JSON schemas of the request models and the stream's events, named as components."""
    modes = [(model, "validation") for model in REQUEST_MODELS] + [(model, "serialization") for model in EVENT_MODELS]
    _, definitions = models_json_schema(modes, ref_template=REF)  # type: ignore[arg-type]
    return definitions.get("$defs", {})


def _typed(document: dict[str, Any], served_model: str, api_key: bool) -> dict[str, Any]:
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in component_schemas().items():
        if components.setdefault(name, schema) != schema:  # one name, two schemas: a reference would lie
            raise RuntimeError(f"two different JSON schemas are named {name!r} in the OpenAPI document")
    model = components[schemas.ChatCompletionRequest.__name__]["properties"]["model"]
    model.update(enum=[served_model], description="The model this server serves, as `GET /v1/models` names it.")
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            # validation errors are 400s here (errors.py), never FastAPI's 422
            operation.get("responses", {}).pop("422", None)
            if api_key and path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}]
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    if api_key:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document
