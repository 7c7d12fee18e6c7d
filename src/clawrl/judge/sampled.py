"""Judging with a sampled language model: m PRM outputs and m hint outputs per turn, parsed and voted.

Both language-model backends (`openai`: a remote endpoint; `engine`: a local model) only differ in
how one completion is obtained, so they share this: they pass a `complete(messages) -> text`
function, and everything else (the prompts, concurrency, parsing, the majority) is the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from clawrl.judge.parsing import parse_hint, prm_verdict
from clawrl.judge.prompts import hint_messages, prm_messages
from clawrl.judge.types import BackendVerdict
from clawrl.types import TurnContext

Complete = Callable[[list[dict[str, Any]]], Awaitable[str]]


async def judge_by_sampling(case: TurnContext, votes: int, complete: Complete) -> BackendVerdict:
    """All 2·m calls concurrently; any call that finally fails fails the whole turn.

    A verdict built from the surviving votes would quietly change what "majority of m" means, so
    the failure propagates and the worker gives the turn back to be judged again in full.
    """
    turn = case.turn
    prm_request = prm_messages(turn.response_text, turn.tool_calls, case.next_messages, turn.messages)
    hint_request = hint_messages(turn.response_text, turn.tool_calls, case.next_messages, turn.messages)
    try:
        async with asyncio.TaskGroup() as calls:  # the first failure cancels the other calls
            prm_calls = [calls.create_task(complete(prm_request)) for _ in range(votes)]
            hint_calls = [calls.create_task(complete(hint_request)) for _ in range(votes)]
    except ExceptionGroup as failures:  # the first failure itself, for the worker's log and callers
        raise failures.exceptions[0] from None
    verdict = prm_verdict([call.result() for call in prm_calls])
    hints = [parse_hint(call.result()) for call in hint_calls]
    return BackendVerdict(
        score=verdict.score,
        votes=verdict.votes,
        rationale=verdict.rationale,
        hint_candidates=list(dict.fromkeys(hint for hint in hints if hint is not None)),  # in order, no repeats
        source="prm",
    )
