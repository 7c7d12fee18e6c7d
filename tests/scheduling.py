"""How `make test` spreads the suite over two pytest-xdist workers (`-n 2 --dist loadscope`).

Two cores, and most of the suite's time is in a few modules that either compute (pre-training,
training, generation) or wait (servers starting, subprocesses, sandboxes). Run side by side, one
worker's waiting is the other's computing. Three rules keep that from costing more than it saves:

- A module's tests stay on one worker, so a module-scoped fixture (a pre-trained model, a vLLM
  server, a built environment) is built once, as in a serial run.
- The modules that borrow the session's shared vLLM server (`vllm_tool_engine` in conftest.py)
  form one unit, so that server starts once.
- The modules that take minutes go out first, so the two workers end together instead of one
  waiting on the last long module.

pytest-xdist's own `--dist loadgroup` would do the first two with markers, but it renames test
ids to carry the group, which pytest 9.2 no longer allows; a scheduler that decides the unit from
the test id needs neither.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

# The modules whose tests borrow the shared vLLM server. conftest.py checks at collection that
# every module using it is listed here: the controller, which schedules, never sees fixtures.
SHARED_VLLM_MODULES = frozenset({
    "tests/test_judge_choice.py", "tests/test_judge_engine.py", "tests/test_judge_worker.py",
    "tests/test_serve_openai.py", "tests/test_sessions.py",
})  # fmt: skip
SHARED_VLLM_FIXTURES = frozenset({"vllm_tool_engine", "serving_engine"})

# The modules that take a minute or more each on two cores (`pytest --durations`), longest first.
LONG_MODULES = (
    "tests/test_bench_learn.py", "tests/test_engine_contract.py", "tests/test_serve_vllm.py",
    "tests/test_real_shapes.py", "tests/test_soak.py", "tests/test_sim_agents.py", "tests/test_openclaw.py",
)  # fmt: skip


def module_of(nodeid: str) -> str:
    """`tests/test_x.py` for `tests/test_x.py::test_y[param]`."""
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared vLLM server's unit."""
    module = module_of(nodeid)
    return "shared-vllm" if module in SHARED_VLLM_MODULES else module


def rank(nodeid: str) -> int:
    """Where a test's module goes in the run: the long modules first, in `LONG_MODULES`'s order."""
    module = module_of(nodeid)
    return LONG_MODULES.index(module) if module in LONG_MODULES else len(LONG_MODULES)


def unlisted_shared_vllm_modules(items: list[pytest.Item]) -> set[str]:
    """The modules that use the shared vLLM server but are missing from `SHARED_VLLM_MODULES`."""
    users = {module_of(item.nodeid) for item in items if SHARED_VLLM_FIXTURES & set(getattr(item, "fixturenames", ()))}
    return users - SHARED_VLLM_MODULES


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with `unit_of` as the scope, in collection order."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        config.option.loadscopereorder = False  # keep collection order: the long modules first
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
