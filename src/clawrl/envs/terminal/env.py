"""The terminal family: shell tasks in Harbor's task layout, solved with a persistent shell.

A task is a folder (`tasks.py` writes the built-in ones; any directory of such folders
loads with `TerminalEnv(tasks_dir=...)`):

- `instruction.md` is the user message;
- `task.toml` gives the split (`[metadata] split = "train" | "eval"`; train when absent) and the
  verifier's time limit (`[verifier] timeout_sec`);
- `environment/workspace/` is the sandbox image: the starting content of /workspace, where
  commands run. The rest of `environment/` (a Dockerfile, its build context) is ignored: there is
  no Docker here, and the sandbox offers the host's /usr (bash, coreutils, tar, gzip, python3,
  and git where the host has it) instead of an image's packages;
- `tests/test.sh` is the verifier: it runs in /workspace after the episode and writes the reward
  to /logs/verifier/reward.txt (Harbor's contract). It runs in a fresh sandbox, not the episode's:
  the pristine system, the episode's /workspace copied in (as a tar archive made inside the
  episode's sandbox once its shell is gone), and nothing else of the episode, so whatever the
  agent did to its own sandbox's processes, binaries or mounts cannot touch the check. The tests
  are copied in (to /tests) only then, so the model never sees them;
- `solution/solve.sh` is the reference solution the oracle policy runs.

Tools: `shell` runs a command in one bash session kept for the whole episode (cwd and variables
persist; a command that times out takes the shell with it, and the next one gets a new shell),
and `finish` ends the episode. An answer without a tool call ends it too, and so does the step
limit; every ending is verified, and the verifier's reward is the outcome.
"""

from __future__ import annotations

import base64
import io
import tarfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clawrl.config import EnvConfig
from clawrl.envs.episode import Outcome, Tool, ToolEnvironment, command_output
from clawrl.envs.protocol import Action, ChatMessage, Split
from clawrl.envs.sandbox import Sandbox, SandboxError, SandboxLimits, ShellSession
from clawrl.envs.terminal.tasks import REWARD_FILE, generated_tasks_dir

SYSTEM_PROMPT = (
    "You are working in a Linux terminal. Use the `shell` tool to run commands; the working directory is "
    "/workspace and the shell keeps its state between calls. There is no network. When the task is done, call "
    "`finish`."
)
SHELL_PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "A bash command line."}},
    "required": ["command"],
}
_FINISH_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# Harbor's verifier reads /tests and writes /logs/verifier: the verifier's sandbox has both writable
_VERIFIER_DIRS = ("/tests", "/logs")
_VERIFIER_DISK_MB = 64  # the verifier's tmpfs holds the episode's workspace, the tests and the logs
_VERIFY = "mkdir -p /logs/verifier && base64 -d | tar -xz -C /tests && bash /tests/test.sh"


@dataclass(frozen=True)
class TerminalTask:
    """A task folder, read."""

    id: str
    path: Path
    instruction: str
    split: Split
    verifier_timeout_s: float

    @property
    def workspace(self) -> Path | None:
        workspace = self.path / "environment" / "workspace"
        return workspace if workspace.is_dir() else None


def load_tasks(tasks_dir: Path) -> dict[str, TerminalTask]:
    """Every task folder directly in `tasks_dir` (one with task.toml, instruction.md and tests/test.sh)."""
    tasks = {}
    for folder in sorted(path for path in tasks_dir.iterdir() if path.is_dir()):
        if not all((folder / name).is_file() for name in ("task.toml", "instruction.md", "tests/test.sh")):
            continue
        config = tomllib.loads((folder / "task.toml").read_text())
        split = config.get("metadata", {}).get("split", "train")
        if split not in ("train", "eval"):
            raise ValueError(f"{folder / 'task.toml'}: metadata.split must be train or eval, not {split!r}")
        timeout = float(config.get("verifier", {}).get("timeout_sec", 60.0))
        tasks[folder.name] = TerminalTask(folder.name, folder, (folder / "instruction.md").read_text(), split, timeout)
    return tasks


class TerminalEnv(ToolEnvironment):
    """Harbor-layout shell tasks in a sandbox, verified by their tests/test.sh."""

    name = "terminal"
    description = "shell tasks in Harbor's layout (files, text, permissions, archives, git) with a persistent shell"

    def __init__(self, config: EnvConfig | None = None, tasks_dir: Path | None = None) -> None:
        self.config = config or EnvConfig()
        super().__init__(self.config.max_steps)
        directory = tasks_dir or self.config.terminal_tasks_dir
        directory = directory or generated_tasks_dir(self.config.cache_dir, self.config.terminal_seed)
        self._tasks = load_tasks(Path(directory))
        if not self._tasks:
            raise ValueError(f"no task folders (task.toml, instruction.md, tests/test.sh) in {directory}")
        self._limits = SandboxLimits(command_timeout_s=self.config.command_timeout_s)
        self._task: TerminalTask | None = None
        self._sandbox: Sandbox | None = None
        self._shell: ShellSession | None = None

    async def tasks(self, split: Split) -> list[str]:
        prefixes = tuple(self.config.terminal_prefix_list())
        return [task.id for task in self._tasks.values() if task.split == split and task.id.startswith(prefixes or "")]

    async def reference_solution(self, task: str) -> str:
        """The task's solution/solve.sh (what the oracle runs); never shown to the model."""
        return (self._known(task).path / "solution" / "solve.sh").read_text()

    async def close(self) -> None:
        sandbox, self._sandbox, self._shell = self._sandbox, None, None
        if sandbox is not None:
            await sandbox.close()

    def _known(self, task: str) -> TerminalTask:
        if task not in self._tasks:
            raise ValueError(f"no terminal task {task!r}")
        return self._tasks[task]

    async def _open(self, task: str, seed: int) -> tuple[list[ChatMessage], list[Tool]]:
        self._task = self._known(task)
        await self.close()
        self._sandbox = Sandbox(self._task.workspace, self._limits)
        await self._sandbox.start()
        self._shell = await self._sandbox.shell()
        opening = [ChatMessage(role="system", content=SYSTEM_PROMPT), ChatMessage(role="user", content=self._task.instruction)]
        tools = [
            Tool("shell", "Run a bash command in the task's terminal and see its output.", SHELL_PARAMETERS, self._run_shell),
            Tool("finish", "Say that the task is done; it is then checked.", _FINISH_PARAMETERS, self._finish, ends_episode=True),
        ]
        return opening, tools

    async def _run_shell(self, arguments: dict[str, Any]) -> str:
        assert self._shell is not None
        return await shell_answer(self._shell, arguments["command"], self.config.tool_output_chars)

    async def _finish(self, _arguments: dict[str, Any]) -> str:
        return "finished; the task is being checked"

    async def _outcome(self, final: Action) -> Outcome:
        assert self._task is not None and self._sandbox is not None and self._shell is not None
        await self._shell.close()  # nothing the model started is still running when its work is copied
        try:
            work = await self._sandbox.export_workspace()
            return await self._verify(self._task, work)
        except SandboxError as error:  # a workspace too big to copy or to hold: the work earns nothing
            return Outcome(0.0, {"verifier_error": f"the episode's /workspace could not be checked: {error}"})
        finally:
            await self.close()

    async def _verify(self, task: TerminalTask, work: bytes) -> Outcome:
        """Run the task's tests in a fresh sandbox holding `work` (room for it and the tests)."""
        limits = replace(self._limits, disk_mb=self._limits.disk_mb + _VERIFIER_DISK_MB)
        async with Sandbox(limits=limits, writable_dirs=_VERIFIER_DIRS) as verifier:
            await verifier.import_workspace(work)
            tests = base64.b64encode(_tar_gz_of(task.path / "tests")).decode()
            result = await verifier.run(_VERIFY, stdin=tests, timeout_s=task.verifier_timeout_s)
            # the reward counts only from a test.sh that ran to its end, as a regular file
            reward_text = (await verifier.run(f"[ -f {REWARD_FILE} ] && [ ! -L {REWARD_FILE} ] && cat {REWARD_FILE}", cwd="/")).stdout
        info: dict[str, Any] = {"verifier_exit_code": result.exit_code}
        try:
            reward = float(reward_text.strip()) if result.exit_code == 0 else 0.0
        except ValueError:
            reward = 0.0
        if result.exit_code != 0 or not reward_text.strip():
            output = command_output(result.stdout, result.stderr, result.exit_code, result.timed_out, 500)
            info["verifier_error"] = f"test.sh failed or wrote no reward to {REWARD_FILE}: {output}"
        return Outcome(reward, info)


async def shell_answer(shell: ShellSession, command: str, output_chars: int) -> str:
    """What the `shell` tool answers: the command's output, and a note when its timeout restarted the shell."""
    result = await shell.run(command)
    output = command_output(result.stdout, result.stderr, result.exit_code, result.timed_out, output_chars)
    return output + ("\n[the shell was restarted: its state is lost]" if result.timed_out else "")


def _tar_gz_of(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()
