"""A request body parsed as JSON, or a 400 error object saying why it cannot be: shared by every
HTTP surface that takes a JSON body (`clawrl serve`'s `read_json`, `clawrl envs serve`'s routes).

`json.loads` raises more than `JSONDecodeError`: a `ValueError` for an integer over Python's
4,300-digit limit on int conversion (a guard against quadratic-time parsing, issue 26) and a
`RecursionError` for deep nesting; and some bodies parse into values nothing downstream can
handle (a lone surrogate, a nesting that overflows a later recursive walk, a number that is not
finite). Each of these used to end as a 500; here each is a 400 with the code `invalid_json`,
before anything reads the value (so a refused request records nothing).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from clawrl.errors import APIError

MAX_JSON_DEPTH = 64


def parse_json_body(body: bytes | bytearray) -> Any:
    """The JSON value of a non-empty `body`; an `APIError` (400, invalid_json) when it is not one
    that the server can safely process."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"The request body is not valid JSON: {error}", "invalid_json") from None
    except ValueError:
        # Not a JSONDecodeError (checked above): the only other ValueError json.loads raises is
        # Python's limit on converting long digit strings to int. Its own text names a
        # Python-internal switch, so say what the client can act on instead.
        limit = sys.get_int_max_str_digits()
        raise APIError(400, f"The request body contains an integer with more than {limit} digits.", "invalid_json") from None
    except RecursionError:  # e.g. 30,000 nested '[': fits the size limit, overflows the parser's stack
        problem: str | None = f"is nested more than {MAX_JSON_DEPTH} levels deep"
    else:
        problem = _json_problem(value)
    if problem is not None:
        raise APIError(400, f"The request body {problem}.", "invalid_json")
    return value


def _json_problem(value: Any) -> str | None:
    """What makes parsed JSON unsafe to process further, if anything (iterative: no recursion limit).

    Chat templates, hashing and the store all walk the body recursively, so a body nested a few
    hundred levels deep would overflow one of them; a lone surrogate escape ("\\ud800") parses
    to a str that cannot be encoded as UTF-8, which the tokenizer, the store and every JSON answer
    echoing it refuse; and Python reads `NaN`, `Infinity` and `1e400` (as inf) though JSON has no
    such numbers, so they cannot be written back: PostgreSQL's json column refuses the `Infinity`
    that json.dumps writes for a tool schema holding one. Each would otherwise surface as a 500.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _is_utf8_encodable(item):
                return "contains an invalid Unicode escape (a lone UTF-16 surrogate)"
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return "contains a number that is not finite (NaN, Infinity, or beyond a float's range, like 1e400)"
            continue
        children: list[Any]
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return f"is nested more than {MAX_JSON_DEPTH} levels deep"
        stack.extend((child, depth + 1) for child in children)
    return None


def _is_utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
