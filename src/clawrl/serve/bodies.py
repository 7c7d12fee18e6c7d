"""Reading a request body: every JSON route of `clawrl serve` (Chat Completions, Responses, Messages,
feedback, episodes) reads its body here, so size limits and malformed JSON are refused alike."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from clawrl.errors import APIError
from clawrl.jsonbody import parse_json_body

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, refusing bodies over `limit` bytes before reading them whole
    (and, like every JSON body, what the parser refuses or nothing downstream could use: jsonbody.py)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"Request body is {declared} bytes; the limit is {limit}.", "request_too_large")
    body = bytearray()
    async for piece in request.stream():
        body.extend(piece)
        if len(body) > limit:
            raise APIError(413, f"Request body exceeds the limit of {limit} bytes.", "request_too_large")
    if not body:
        raise APIError(400, "The request body is empty; send a JSON object.", "invalid_json")
    value = parse_json_body(body)
    if not isinstance(value, dict):
        raise APIError(400, f"The request body must be a JSON object, not {_JSON_KINDS[type(value)]}.", "invalid_value")
    return value
