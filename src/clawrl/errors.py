"""OpenAI-style error objects for every HTTP surface of clawrl (the API and the dashboard):
every refusal is `{"error": {"message", "type", "param", "code"}}`.

Bad input gets a 4xx with a sentence a person can act on, never a 500 and never a pydantic dump.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list"}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers  # e.g. the dashboard's WWW-Authenticate challenge


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.message, error.code, error.param), status_code=error.status, headers=error.headers
    )


def describe_validation_error(error: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """The first invalid field's most telling problem, as (sentence, parameter path)."""
    errors = error.errors()
    first_path = _path(errors[0])
    # A union field reports one error per branch, in declaration order, so the first is often
    # "Input should be a valid string" for a list that was fine as a list (5 stop strings, an
    # image content part). The branch that got furthest into the value explains it best; among
    # equals, one that accepted the type (its error is not a `*_type` mismatch).
    same_field = [e for e in errors if _path(e)[: len(first_path)] == first_path]
    first = max(same_field, key=lambda e: (len(_path(e)), not str(e.get("type", "")).endswith("_type")))
    param = ".".join(_path(first)) or None
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    if first.get("type") in ("model_type", "model_attributes_type", "dict_type"):
        message = "Input should be a JSON object"  # pydantic's wording names our Python classes
    return (f"{param}: {message}" if param else message), param


def _path(error: Any) -> list[str]:
    """An error's location as request parameter names, without pydantic's union-branch names."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    # drop pydantic's union-branch names ("str", "list[TextPart]", "function-after[...]") from the path
    return [part for part in location if "[" not in part and part not in _TYPE_NAMES]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, error: APIError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(error)
        return JSONResponse(error_body(400, message, "invalid_value", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        # keep the exception's headers: a 405 must say which methods are allowed (`Allow`)
        return JSONResponse(
            error_body(error.status_code, str(error.detail), code), status_code=error.status_code, headers=error.headers
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error while serving a request")
        return JSONResponse(error_body(500, "internal error; see the server log", "internal_error"), status_code=500)
