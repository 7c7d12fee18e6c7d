"""The tool-call family: a generated problem, a sandboxed `python` tool, an exactly checked answer.

The model gets one problem (problems.py) and one tool, `python`, that runs its code with
/usr/bin/python3 in a sandbox (fresh for every episode, started on the first call) and answers
with the program's stdout, its stderr and exit status when notable, cut to `tool_output_chars`.

The final answer is the model's first message without a tool call: the last `\\boxed{...}` in it,
or, when it has none, the whole message; it is compared exactly with the problem's answer (see
problems.py for the normalisation). Outcome reward 1 or 0 on that step, every other step 0; the
step limit without an answer scores 0.
"""

from __future__ import annotations

from typing import Any

from clawrl.config import EnvConfig
from clawrl.envs.episode import Outcome, Tool, ToolEnvironment, command_output
from clawrl.envs.protocol import Action, ChatMessage, Split
from clawrl.envs.sandbox import Sandbox, SandboxLimits
from clawrl.envs.toolcall.problems import Problem, final_answer, parse_number, problem, problem_ids

SYSTEM_PROMPT = (
    "You solve math problems. You can run Python with the `python` tool (print what you need to see). "
    "When you know the answer, reply without calling a tool and put the final answer in \\boxed{}, e.g. \\boxed{42}. "
    "Give integers as integers and non-integers as a fraction or a decimal."
)
_PYTHON_PARAMETERS = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "A Python 3 program; its stdout is returned."}},
    "required": ["code"],
}


class ToolCallEnv(ToolEnvironment):
    """Generated problems with verifiable answers, solved with a sandboxed Python tool."""

    name = "toolcall"
    description = "generated math problems (arithmetic, number theory, units, word problems) with a sandboxed python tool"

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig()
        super().__init__(self.config.max_steps)
        self._limits = SandboxLimits(command_timeout_s=self.config.command_timeout_s)
        self._sandbox: Sandbox | None = None
        self._problem: Problem | None = None

    async def tasks(self, split: Split) -> list[str]:
        count = self.config.toolcall_train_problems if split == "train" else self.config.toolcall_eval_problems
        return problem_ids(split, count, self.config.toolcall_kind_list(), self.config.toolcall_level_list())

    async def reference_solution(self, task: str) -> str:
        """A program printing the answer (what the oracle runs); never shown to the model."""
        return problem(task).solution_code

    async def close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()

    async def _open(self, task: str, seed: int) -> tuple[list[ChatMessage], list[Tool]]:
        self._problem = problem(task)  # ValueError for an id that names no problem
        await self.close()  # a fresh sandbox per episode: nothing carries over from the last one
        opening = [ChatMessage(role="system", content=SYSTEM_PROMPT), ChatMessage(role="user", content=self._problem.question)]
        return opening, [Tool("python", "Run a Python 3 program in a sandbox and see its output.", _PYTHON_PARAMETERS, self._run_python)]

    async def _run_python(self, arguments: dict[str, Any]) -> str:
        if self._sandbox is None:
            sandbox = Sandbox(limits=self._limits)
            await sandbox.start()
            self._sandbox = sandbox
        result = await self._sandbox.run("/usr/bin/python3 -", stdin=arguments["code"])
        return command_output(result.stdout, result.stderr, result.exit_code, result.timed_out, self.config.tool_output_chars)

    async def _outcome(self, final: Action) -> Outcome:
        assert self._problem is not None
        await self.close()
        expected = self._problem.answer
        if final.tool_calls:  # the step limit came first
            return Outcome(0.0, {"answer": None, "expected": str(expected), "correct": False})
        answer = final_answer(final.content or "")
        correct = parse_number(answer) == expected
        return Outcome(float(correct), {"answer": answer, "expected": str(expected), "correct": correct})
