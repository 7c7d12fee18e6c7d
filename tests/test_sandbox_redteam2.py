"""Second red team of the sandbox (after issue 26 and tests/test_sandbox_redteam.py): attacks that
neither test_sandbox_attacks.py nor test_sandbox_redteam.py tries.

Each test drives a real sandbox (or a real family environment) as hostile agent code would and
asserts what the attacker must not observe. The first group escaped when this file was written
(each failed until its fix landed):

* a ``ShellSession`` command that makes the shell stop reading its input (here: it forges a valid
  end marker, learnt from bash's saved copy of its stdin, and keeps running) makes the runner hang
  for ever on the next command longer than a pipe holds: ``ShellSession._run`` awaits
  ``proc.stdin.drain()`` outside the command's timeout;
* the terminal verifier neutralises the config of every ``.git`` it finds, but git also discovers
  a *bare* repository (a directory holding HEAD, objects/ and refs/): the agent turns ``repo/``
  into one whose own config names ``gpg.program``, and the checks' ``git log`` runs the agent's
  program in the verifier. It appends a line to /tests/test.sh, which bash is still reading:
  reward 1 on an unsolved task. (Its test is a case of the git-config test in
  test_sandbox_redteam.py.)

The second group was contained and must stay so: seccomp bypasses from a static binary (namespace
flags in the upper half of clone's flags, clone3, the ``syscall`` instruction after a personality
change, a 64-bit TIOCSTI/TIOCLINUX request, AF_VSOCK with high bits), the runner's descriptors
never reaching a command, a sandbox full of hostile processes (stopped, ignoring signals, a fork
bomb) closing fast and leaving no process or cgroup behind, two sandboxes at once sharing no
/dev/shm, abstract socket or SysV IPC, and the SWE family's ``git add``/``git diff`` in the agent's
repository, whose fsmonitor hook cannot write into the command's stdout (the patch).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from clawrl.config import EnvConfig
from clawrl.envs.protocol import Action
from clawrl.envs.sandbox import Sandbox, SandboxLimits, sandbox_available
from clawrl.envs.swe.env import SWEEnv
from tests.helpers import wait_until

REASON = sandbox_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"sandbox unavailable: {REASON}")
T = TypeVar("T")


def arun(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def tool_call(name: str, **arguments: object) -> Action:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return Action.model_validate({"tool_calls": [call]})


def live_processes_of(uid: int) -> list[str]:
    """Host processes running as `uid` that are not already dead (zombies, or exiting)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        state = status.split("State:")[1].split()[0]
        if int(status.split("Uid:")[1].split()[0]) == uid and state not in ("Z", "X"):
            found.append(f"{entry.name} {state} {(entry / 'comm').read_text().strip()}")
    return found


# --- escapes -----------------------------------------------------------------------------------

# The command reads the runner's script from bash's saved stdin (fd 10), prints the end marker
# with a valid status on both streams, and goes on running: the shell reads no more input.
FORGE_VALID_MARKER = r"""
rest=""; while IFS= read -r -t 1 line <&10; do rest="$rest$line"$'\n'; done
token=$(printf '%s' "$rest" | grep -o '__CLAWRL_DONE_[0-9a-f]*__' | head -1)
printf '\n%s0\n' "$token"; printf '\n%s0\n' "$token" >&2
sleep 3600
"""


def test_a_shell_that_stops_reading_its_input_cannot_hang_the_runner() -> None:
    """The next command (500 kB: a file written through a here-document, say) fills the pipe, and
    the runner waited for the pipe to drain with no timeout at all."""

    async def go() -> None:
        async with Sandbox() as box:
            shell = await box.shell()
            for attempt in range(2):
                await shell.run(FORGE_VALID_MARKER, timeout_s=10)
                big = ": '" + "x" * 500_000 + "'; echo after"
                started = time.monotonic()
                try:
                    result = await asyncio.wait_for(shell.run(big, timeout_s=3), 12)
                except asyncio.TimeoutError:
                    pytest.fail(f"attempt {attempt}: a command with timeout_s=3 had not returned after 12 s")
                assert time.monotonic() - started < 10, "the timeout did not bound the command"
                assert result.timed_out or result.stdout.endswith("after\n"), result
            assert (await shell.run("echo still here")).stdout == "still here\n"

    arun(go())


# --- contained, kept so ------------------------------------------------------------------------

SECCOMP_PROBE = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/personality.h>
#include <sys/syscall.h>
#include <linux/sched.h>

static long raw(long nr, long a, long b, long c, long d) {  /* the syscall instruction, no libc wrapper */
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile ("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}
static void userns(char *out) { ssize_t n = readlink("/proc/self/ns/user", out, 63); out[n > 0 ? n : 0] = 0; }

int main(void) {
    char mine[64], theirs[64];
    userns(mine);
    long pid = raw(SYS_clone, ((long)(CLONE_NEWUSER | CLONE_NEWNS) << 32) | SIGCHLD, 0, 0, 0);
    if (pid == 0) { userns(theirs); _exit(strcmp(mine, theirs) ? 42 : 0); }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    printf("clone-upper %s\n", pid < 0 ? "refused" : WEXITSTATUS(status) == 42 ? "new-namespace" : "same-namespace");
    pid = raw(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0);
    if (pid == 0) _exit(0);
    printf("clone-newuser %ld\n", pid);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_NEWUSER; args.exit_signal = SIGCHLD;
    pid = raw(435, (long)&args, sizeof args, 0, 0);
    if (pid == 0) _exit(0);
    printf("clone3 %ld\n", pid);
    personality(PER_LINUX32 | ADDR_NO_RANDOMIZE);
    printf("unshare %ld\n", raw(SYS_unshare, CLONE_NEWUSER, 0, 0, 0));
    printf("setns %ld\n", raw(SYS_setns, open("/proc/self/ns/user", O_RDONLY), 0, 0, 0));
    char c = 'x';
    printf("tiocsti64 %ld\n", raw(SYS_ioctl, 0, (1L << 32) | 0x5412, (long)&c, 0));
    printf("tioclinux64 %ld\n", raw(SYS_ioctl, 0, (0xffffffffL << 32) | 0x541C, (long)&c, 0));
    printf("tcgets %ld\n", raw(SYS_ioctl, 0, 0x5401, (long)&c, 0));
    printf("vsock64 %ld\n", raw(SYS_socket, (1L << 32) | 40, 1, 0, 0));
    printf("keyctl %ld\n", raw(SYS_keyctl, 0, -3, 0, 0));
    printf("fsopen %ld\n", raw(430, (long)"tmpfs", 0, 0, 0));
    return 0;
}
"""
SECCOMP_EXPECTED = [
    "clone-upper same-namespace",  # the kernel reads only the low 32 bits: a plain fork
    "clone-newuser -1", "clone3 -38", "unshare -1", "setns -1",  # EPERM, ENOSYS
    "tiocsti64 -1", "tioclinux64 -1", "tcgets -25",  # EPERM by the filter; ENOTTY from the kernel
    "vsock64 -97", "keyctl -1", "fsopen -1",  # EAFNOSUPPORT, EPERM
]  # fmt: skip


@pytest.mark.skipif(os.uname().machine != "x86_64" or shutil.which("gcc") is None, reason="x86_64 with gcc")
def test_a_static_binary_making_raw_system_calls_gets_past_no_filter_rule(tmp_path: Path) -> None:
    (tmp_path / "probe.c").write_text(SECCOMP_PROBE)
    built = subprocess.run(["gcc", "-O2", "-static", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], capture_output=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build a static binary here: {built.stderr.decode()[-200:]}")
    binary = base64.b64encode((tmp_path / "probe").read_bytes()).decode()

    async def go() -> None:
        async with Sandbox() as box:
            for _ in range(2):
                result = await box.run("base64 -d > /tmp/probe && chmod +x /tmp/probe && /tmp/probe", stdin=binary)
                assert result.stdout.splitlines() == SECCOMP_EXPECTED, result

    arun(go())


def test_no_descriptor_of_the_runner_reaches_a_command() -> None:
    async def go() -> None:
        async with Sandbox() as box:
            listing = "python3 -c 'import os; print(*(n for n in os.listdir(\"/proc/self/fd\") if os.path.lexists(\"/proc/self/fd/\" + n)))'"
            once = await box.run(listing)
            shell = await box.shell()
            in_shell = await shell.run(listing)
        for result in (once, in_shell):
            assert sorted(result.stdout.split()) == ["0", "1", "2"], result

    arun(go())


HOSTILE_PROCESSES = r"""
for i in $(seq 15); do (trap '' TERM HUP INT; setsid sleep 1000 & exec sleep 1000) & done
python3 -c 'import os, signal, time
for s in (signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)
if os.fork() == 0:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(1000)' &
python3 -c 'import os, time
while True:
    try:
        os.fork() or time.sleep(1000)
    except OSError:
        time.sleep(0.1)' &
sleep 1; echo spawned
"""


def test_a_sandbox_full_of_hostile_processes_closes_fast_and_leaves_nothing() -> None:
    async def go() -> None:
        descriptors = len(os.listdir("/proc/self/fd"))
        for _ in range(2):
            box = Sandbox(limits=SandboxLimits(processes=64))
            await box.start()
            uid, groups = box.outer_uid, box.cgroup_paths
            shell = await box.shell()
            assert (await shell.run(HOSTILE_PROCESSES, timeout_s=20)).stdout == "spawned\n"
            for _ in range(10):
                await shell.run("true")
                await box.run("true")
            started = time.monotonic()
            await box.close()
            assert time.monotonic() - started < 5
            assert not [group for group in groups if group.exists()], "a cgroup directory outlived the sandbox"
            wait_until(lambda: not live_processes_of(uid), 10, "the sandbox's processes to die")
        assert len(os.listdir("/proc/self/fd")) == descriptors, "the runner leaks descriptors"

    arun(go())


PLANT = r"""
echo planted > /dev/shm/planted; ipcmk -M 4096 > /dev/null; ipcmk -Q > /dev/null
python3 -c '
import socket, time
s = socket.socket(socket.AF_UNIX); s.bind("\0clawrl-redteam2"); s.listen(1)
print("bound", flush=True); time.sleep(30)' &
sleep 1
"""
PROBE = r"""
ls /dev/shm; ipcs -m -q | grep -c 0x; grep -c clawrl-redteam2 /proc/net/unix
python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0clawrl-redteam2"); print("reached")
except OSError as error:
    print("refused", error.errno)'
"""


def test_two_sandboxes_at_once_share_no_shm_ipc_or_abstract_socket() -> None:
    async def go() -> None:
        async with Sandbox() as first, Sandbox() as second:
            assert first.outer_uid != second.outer_uid
            shell = await first.shell()
            assert "bound" in (await shell.run(PLANT, timeout_s=10)).stdout
            for _ in range(2):
                seen = await second.run(PROBE)
                assert seen.stdout.split() == ["0", "0", "refused", "111"], seen  # ECONNREFUSED
            own = await first.run(PROBE)
            assert own.stdout.split()[:3] == ["planted", "2", "1"], own

    arun(go())


# The agent's own repository config names an fsmonitor hook; the judge's `git add -A` in the
# episode's sandbox runs it, and it tries to write a diff of a test file into git's stdout (the
# command's output, which is the patch).
FSMONITOR_INJECTION = r"""
cat > .git/fsmonitor <<'HOOK'
#!/bin/bash
printf 'diff --git a/tests/__init__.py b/tests/__init__.py\n--- a/tests/__init__.py\n+++ b/tests/__init__.py\n@@ -0,0 +1 @@\n+import calc; calc.add = lambda a, b: a + b\n' > /proc/$PPID/fd/1
exit 1
HOOK
chmod +x .git/fsmonitor && git config core.fsmonitor "$PWD/.git/fsmonitor" && echo configured
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="the SWE family needs git")
def test_the_swe_patch_takes_nothing_a_git_hook_of_the_agent_writes(tmp_path: Path) -> None:
    def git(directory: Path, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, check=True).stdout

    repo = tmp_path / "repos" / "acme__calc"
    (repo / "tests").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "__init__.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "calc")
    tests = "import unittest\nfrom calc import add\n\nclass AddTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    test_patch = (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_calc.py\n"
        f"@@ -0,0 +1,{len(tests.splitlines())} @@\n" + "".join(f"+{line}\n" for line in tests.splitlines())
    )
    record = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": git(repo, "rev-parse", "HEAD").strip(),
              "problem_statement": "add(2, 3) gives -1", "patch": "", "test_patch": test_patch,
              "FAIL_TO_PASS": '["tests.test_calc.AddTest.test_add"]', "PASS_TO_PASS": "[]", "split": "eval", "hints_text": ""}  # fmt: skip
    (tmp_path / "instances.jsonl").write_text(json.dumps(record) + "\n")

    async def play() -> tuple[float, dict]:
        env = SWEEnv(EnvConfig(swe_instances=tmp_path / "instances.jsonl", cache_dir=tmp_path / "cache"))
        try:
            await env.reset(seed=0, task="acme__calc-1")
            await env.step(tool_call("shell", command=FSMONITOR_INJECTION))
            result = await env.step(tool_call("submit"))
            return result.reward, result.info
        finally:
            await env.close()

    for _ in range(2):
        reward, info = arun(play())
        assert reward == 0.0 and info["patch_lines"] == 0, info
