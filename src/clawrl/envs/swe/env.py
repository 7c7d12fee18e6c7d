"""The SWE family: fix an issue in a Python repository; resolved when the hidden tests pass.

An instance (`instances.py`, SWE-bench's schema) names a repository, a commit and an issue.
The episode's sandbox holds a checkout of that commit (its history only) at /workspace; the user
message is the issue. Tools:

- `shell`: a bash session kept for the whole episode (the terminal family's);
- `view_file(path, start_line, end_line)`: a text file with line numbers;
- `edit_file(path, old, new)`: replace the one occurrence of `old` in a file with `new`; an `old`
  that does not occur, or occurs more than once, is refused with a message saying so;
- `submit`: ends the episode. An answer without a tool call, or the step limit, ends it too.

Every ending is judged (`judge.py`): the working copy's diff against `base_commit`, test files
left out, goes onto a fresh copy with the hidden tests, and FAIL_TO_PASS and PASS_TO_PASS run; the
reward is 1 when all of them pass, else 0, and `info` holds the share that passed.

Instances come from a JSON Lines file with a directory of repositories (`--swe-instances`,
`--swe-repos-dir`), or from the built-in generator (`generate.py`), written once under
`--cache-dir`.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from pathlib import Path
from typing import Any

from clawrl.config import EnvConfig
from clawrl.envs.episode import Outcome, Tool, ToolEnvironment, truncate
from clawrl.envs.protocol import Action, ChatMessage, Split
from clawrl.envs.sandbox import WORKDIR, Sandbox, SandboxError, SandboxLimits, ShellSession
from clawrl.envs.swe.generate import INSTANCES_FILE, generated_instances_dir
from clawrl.envs.swe.instances import SWEInstance, checkout, load_instances
from clawrl.envs.swe.judge import JUDGE_TIMEOUT_S, Verdict, judge, working_copy_patch
from clawrl.envs.terminal.env import SHELL_PARAMETERS, shell_answer

SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in a Python repository, checked out at /workspace (a git "
    "repository; there is no network). `shell` runs bash commands in a shell that keeps its state, `view_file` shows "
    "a file with line numbers, and `edit_file` replaces an exact piece of a file's text. Change the code, not the "
    "tests: hidden tests decide whether the issue is resolved. When the fix is done, call `submit`."
)
MAX_FILE_BYTES = 1_000_000  # larger files are for the shell: the edit tools hold a file in one message
_VIEW_PARAMETERS = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file, relative to /workspace or absolute."},
        "start_line": {"type": "integer", "description": "First line to show (from 1; default 1)."},
        "end_line": {"type": "integer", "description": "Last line to show (default: the last one)."},
    },
    "required": ["path"],
}
_EDIT_PARAMETERS = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file, relative to /workspace or absolute."},
        "old": {"type": "string", "description": "The exact text to replace, whitespace included; it must occur once."},
        "new": {"type": "string", "description": "The text to put in its place."},
    },
    "required": ["path", "old", "new"],
}
_SUBMIT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class SWEEnv(ToolEnvironment):
    """Issues in Python repositories, judged by hidden tests on a fresh copy (SWE-bench's way)."""

    name = "swe"
    description = "fix an issue in a small Python repository (SWE-bench's schema); resolved when hidden tests pass"

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig()
        super().__init__(self.config.max_steps)
        instances_file = self.config.swe_instances
        if instances_file is None:
            generated = generated_instances_dir(self.config.cache_dir, self.config.swe_seed, self.config.swe_kind_list(),
                                                self.config.swe_library_list())  # fmt: skip
            instances_file = generated / INSTANCES_FILE
        self._instances = load_instances(Path(instances_file))
        if not self._instances:
            raise ValueError(f"no SWE instances in {instances_file}")
        self._repos_dir = self.config.swe_repos_dir or Path(instances_file).parent / "repos"
        self._limits = SandboxLimits(command_timeout_s=self.config.command_timeout_s)
        # the judge's run is one process for every test: it gets the run's whole time in CPU too
        self._judge_limits = SandboxLimits(cpu_seconds=int(JUDGE_TIMEOUT_S), command_timeout_s=JUDGE_TIMEOUT_S)
        self._instance: SWEInstance | None = None
        self._checkout: Path | None = None
        self._sandbox: Sandbox | None = None
        self._shell: ShellSession | None = None

    async def tasks(self, split: Split) -> list[str]:
        return [instance.instance_id for instance in self._instances.values() if instance.split == split]

    async def reference_solution(self, task: str) -> str:
        """A script applying the instance's gold patch (what the oracle runs); never shown to the model."""
        patch = self._known(task).patch
        return f"cd {WORKDIR}\ngit apply <<'CLAWRL_GOLD_PATCH'\n{patch.rstrip(chr(10))}\nCLAWRL_GOLD_PATCH\n"

    async def close(self) -> None:
        sandbox, self._sandbox, self._shell = self._sandbox, None, None
        if sandbox is not None:
            await sandbox.close()

    def _known(self, task: str) -> SWEInstance:
        if task not in self._instances:
            raise ValueError(f"no SWE instance {task!r}")
        return self._instances[task]

    async def _open(self, task: str, seed: int) -> tuple[list[ChatMessage], list[Tool]]:
        self._instance = self._known(task)
        await self.close()
        self._checkout = await asyncio.to_thread(checkout, self._instance, self._repos_dir, self.config.cache_dir)
        self._sandbox = Sandbox(self._checkout, self._limits)
        await self._sandbox.start()
        self._shell = await self._sandbox.shell()
        where = f"The repository {self._instance.repo} is checked out at /workspace (commit {self._instance.base_commit[:12]})."
        opening = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=f"{self._instance.problem_statement.rstrip()}\n\n---\n{where}"),
        ]
        tools = [
            Tool("shell", "Run a bash command in the repository's terminal and see its output.", SHELL_PARAMETERS, self._run_shell),
            Tool("view_file", "Show a text file with line numbers.", _VIEW_PARAMETERS, self._view_file),
            Tool("edit_file", "Replace the one occurrence of `old` in a file with `new`.", _EDIT_PARAMETERS, self._edit_file),
            Tool("submit", "Submit the fix; the hidden tests then judge it.", _SUBMIT_PARAMETERS, self._submit, ends_episode=True),
        ]
        return opening, tools

    async def _run_shell(self, arguments: dict[str, Any]) -> str:
        assert self._shell is not None
        return await shell_answer(self._shell, arguments["command"], self.config.tool_output_chars)

    async def _view_file(self, arguments: dict[str, Any]) -> str:
        text, problem = await self._read(arguments["path"])
        if problem:
            return f"error: {problem}"
        lines = text.splitlines()
        start, end = arguments.get("start_line", 1), arguments.get("end_line", len(lines))
        if start < 1 or end < start:
            return f"error: lines {start} to {end} are not a range: start_line is at least 1 and end_line at least start_line"
        numbered = "\n".join(f"{number:>5}  {line}" for number, line in enumerate(lines[start - 1 : end], start=start))
        return truncate(numbered, self.config.tool_output_chars) or f"[{arguments['path']} has no lines there: it has {len(lines)}]"

    async def _edit_file(self, arguments: dict[str, Any]) -> str:
        path, old, new = arguments["path"], arguments["old"], arguments["new"]
        if not old:
            return "error: `old` is empty: give the exact text to replace (create new files with the shell)"
        text, problem = await self._read(path)
        if problem:
            return f"error: {problem}"
        count = text.count(old)
        if count == 0:
            return f"error: `old` does not occur in {path}; it must match the file exactly, indentation included (view_file shows it)"
        if count > 1:
            return f"error: `old` occurs {count} times in {path}; include more of the surrounding lines so that it occurs once"
        assert self._sandbox is not None
        try:
            await self._sandbox.write_file(_absolute(path), text.replace(old, new, 1))
        except SandboxError as error:
            return f"error: {error}"
        first = text[: text.index(old)].count("\n") + 1
        shown = new.count("\n") + 1
        return f"edited {path}; lines {first}-{first + shown - 1} now read:\n" + await self._view_file(
            {"path": path, "start_line": first, "end_line": first + shown - 1}
        )

    async def _read(self, path: str) -> tuple[str, str | None]:
        """A text file of the sandbox, or why it cannot be edited as one."""
        assert self._sandbox is not None
        where = shlex.quote(_absolute(path))
        result = await self._sandbox.run(
            f"if [ -d {where} ]; then echo 'it is a directory' >&2; exit 2; fi; "
            f"if [ ! -e {where} ]; then echo 'no such file' >&2; exit 2; fi; head -c {MAX_FILE_BYTES + 1} -- {where}",
            cwd="/",
        )  # fmt: skip
        if result.exit_code != 0:
            return "", f"cannot read {path}: {result.stderr.strip() or f'exit code {result.exit_code}'}"
        if len(result.stdout.encode()) > MAX_FILE_BYTES:
            return "", f"{path} is larger than {MAX_FILE_BYTES} bytes: use the shell"
        if "\ufffd" in result.stdout:
            return "", f"{path} is not UTF-8 text: use the shell"
        return result.stdout, None

    async def _submit(self, _arguments: dict[str, Any]) -> str:
        return "submitted; the hidden tests are being run"

    async def _outcome(self, final: Action) -> Outcome:
        assert self._instance is not None and self._checkout is not None
        assert self._sandbox is not None and self._shell is not None
        await self._shell.close()  # nothing the model started keeps changing the files
        patch, problem = await working_copy_patch(self._sandbox, self._instance)
        await self.close()
        if problem is not None:
            verdict = Verdict(False, error=problem)
        else:
            verdict = await judge(self._instance, self._checkout, patch, self._judge_limits)
        return Outcome(float(verdict.resolved), verdict.info() | {"patch_lines": patch.count("\n")})


def _absolute(path: str) -> str:
    """A path of the sandbox; relative ones are taken from /workspace."""
    return posixpath.normpath(posixpath.join(WORKDIR, path))
