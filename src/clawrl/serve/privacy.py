"""What a request, its session or its user asked not to be recorded or trained on (DESIGN §12, opt-out).

- **Not recorded**: `"store": false` in a Chat Completions or Messages body (OpenAI's field; the
  Responses API's own `store`), or a user set `clawrl users set NAME --no-store`: answered, and
  nothing of it is stored (no session, no turn), so it is never judged, trained on or exported.
- **Not trained on**: `X-Clawrl-Train: false` or `"train": false`, or a user set `--no-train`: the
  turn is recorded for its user (they read and export it) with why in its `opt_out`, and is never
  judged nor made a sample. The request that starts a session opts the session out with it: every
  later turn of that session is no-train too (`store/turns.py`), whatever its own request says.
"""

from __future__ import annotations

from clawrl.errors import APIError
from clawrl.serve.auth import Caller
from clawrl.serve.sessions import TRUE_WORDS
from clawrl.types import OptOut, TurnKind

FALSE_WORDS = {"0", "false", "no", "off"}


def stored(recorded: bool, body_store: bool, caller: Caller) -> bool:
    """Whether to record the turn: the wire API's own say (`recorded`), the body's `store`, and the caller's setting."""
    return recorded and body_store and caller.store


def opt_out(headers: dict[str, str], body_train: bool, caller: Caller) -> OptOut | None:
    """Why the turn is never to be trained on, or None: the request's own word first (the
    `X-Clawrl-Train` header over the body's `train`), then the caller's setting. A session's no-train
    is the store's to add, where the session is known."""
    header = headers.get("x-clawrl-train", "").strip().lower()
    if header and header not in TRUE_WORDS | FALSE_WORDS:
        raise APIError(400, "X-Clawrl-Train must be 'true' or 'false'", "invalid_train", "X-Clawrl-Train")
    train = header in TRUE_WORDS if header else body_train
    if not train:
        return "request"
    return None if caller.train else "user"


def notes_asked(headers: dict[str, str], body_memory: bool | None, kind: TurnKind) -> bool:
    """Whether the prompt carries the user's memory notes (with --memory on): the request's word (the
    `X-Clawrl-Memory` header over the body's `memory`), else main turns do and side turns do not. A
    side turn that asks for them is how an evaluation sees what the notes do without training on it."""
    header = headers.get("x-clawrl-memory", "").strip().lower()
    if header and header not in TRUE_WORDS | FALSE_WORDS:
        raise APIError(400, "X-Clawrl-Memory must be 'on' or 'off'", "invalid_memory", "X-Clawrl-Memory")
    if header:
        return header in TRUE_WORDS
    return body_memory if body_memory is not None else kind == "main"
