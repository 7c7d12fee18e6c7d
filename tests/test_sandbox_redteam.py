"""Red team of the rebuilt sandbox (after issue 26): attacks that test_sandbox_attacks.py does not try.

Each test drives a real sandbox as hostile agent code would (a command of ``Sandbox.run``, of a
``ShellSession``, or a terminal episode's shell commands) and asserts what the attacker must not
observe. The first group escaped the rebuilt sandbox when this file was written (each failed
until its fix landed):

* the terminal verifier runs ``git`` in the agent's repository, and git runs programs the agent
  named in the repository's own config (``gpg.program`` with ``log.showSignature``): the agent's
  program writes reward 1 and kills test.sh before it writes 0;
* a command's pid 1 that drops its parent-death signal (a shell's ``exec``, or ``ptrace`` of the
  command's own pid 1) outlives the command's timeout and the shell's close;
* a sparse file is exported as its full size: a workspace of no disk makes the runner hold an
  archive of hundreds of megabytes, and the verifier's import fails with an exception that ends
  the episode's step;
* a shell command that reads the rest of the runner's script (the shell's saved stdin) learns the
  end marker and forges it: the runner raises ValueError.

The second group was contained and must stay so: 32-bit and x32 system calls, SysV shared memory
and message queues and pipe buffers (charged to the sandbox's cgroup), AF_VSOCK.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import fcntl
import struct
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from clawrl.config import EnvConfig
from clawrl.envs.protocol import Action
from clawrl.envs.sandbox import Sandbox, SandboxLimits, sandbox_available
from clawrl.envs.terminal.env import TerminalEnv
from clawrl.envs.terminal.tasks import generate_tasks
from tests.helpers import host_pids_with, wait_until

REASON = sandbox_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"sandbox unavailable: {REASON}")
T = TypeVar("T")


def arun(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]




def shell_action(command: str) -> Action:
    arguments = json.dumps({"command": command})
    return Action.model_validate({"tool_calls": [{"id": "s1", "type": "function", "function": {"name": "shell", "arguments": arguments}}]})


def needs_cgroup(box: Sandbox) -> None:
    if box.confinement.startswith("no cgroup"):
        pytest.skip(f"this host gives the sandbox no cgroup: {box.confinement}")


# --- escapes -----------------------------------------------------------------------------------

# The repository's HEAD becomes a commit with a (fake) signature; `git log` then runs gpg.program
# from the repository's config to check it, inside the verifier, with /logs writable.
GIT_SIGNATURE_HOOK = r"""
cd /workspace/repo
printf '#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\nkill -9 -1\n' > .git/gpg-helper
chmod +x .git/gpg-helper
git config log.showSignature true
git config gpg.program "$PWD/.git/gpg-helper"
tree=$(git rev-parse 'HEAD^{tree}')
commit=$(printf 'tree %s\nparent %s\nauthor a <a@b> 0 +0000\ncommitter a <a@b> 0 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n -----END PGP SIGNATURE-----\n\nnot the message\n' "$tree" "$(git rev-parse HEAD)" | git hash-object -t commit -w --stdin)
git update-ref HEAD "$commit"
"""


# `repo/.git` becomes `repo/` itself, a bare repository that `find -name .git` does not see; its own
# config names gpg.program, and HEAD is a commit with a (fake) signature, so the check's `git log` runs it.
BARE_REPOSITORY_HOOK = r"""
cd /workspace
mv repo/.git bare && rm -rf repo && mv bare repo && cd repo
git config core.bare true
printf '#!/bin/bash\necho "echo 1 > /logs/verifier/reward.txt" >> /tests/test.sh\n' > gpg-helper
chmod +x gpg-helper
git config log.showSignature true
git config gpg.program /workspace/repo/gpg-helper
tree=$(git rev-parse 'HEAD^{tree}')
commit=$(printf 'tree %s\nparent %s\nauthor a <a@b> 0 +0000\ncommitter a <a@b> 0 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n -----END PGP SIGNATURE-----\n\nnot the message\n' "$tree" "$(git rev-parse HEAD)" | git hash-object -t commit -w --stdin)
git update-ref HEAD "$commit"
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="the git tasks need git")
@pytest.mark.parametrize("hook", ["signature", "bare repository"])
def test_the_verifier_runs_no_program_named_by_the_agents_git_config(tmp_path: Path, hook: str) -> None:
    """A built-in git task left unsolved (the changes not committed, another message): reward 0.
    The bare repository case was found by the second red team (test_sandbox_redteam2.py)."""
    generate_tasks(tmp_path, 0, True, prefixes=("git-commit_changes-",))
    task = sorted(path.name for path in tmp_path.iterdir())[0]

    async def play() -> float:
        env = TerminalEnv(EnvConfig(max_steps=4), tasks_dir=tmp_path)
        try:
            await env.reset(seed=0, task=task)
            await env.step(shell_action(GIT_SIGNATURE_HOOK if hook == "signature" else BARE_REPOSITORY_HOOK))
            return (await env.step(Action(content="done"))).reward
        finally:
            await env.close()

    assert arun(play()) == 0.0, "git ran the agent's gpg.program in the verifier, and it wrote the reward"


DROP_PDEATHSIG = "import ctypes, time; ctypes.CDLL(None).prctl(1, 0, 0, 0, 0); time.sleep(120)"


def test_a_shell_that_drops_its_parent_death_signal_dies_at_its_timeout_and_close() -> None:
    """The shell is its pid namespace's pid 1; `exec` makes the agent's program that pid 1, and
    it clears the parent-death signal the chain relies on."""
    token = uuid.uuid4().hex

    async def go() -> None:
        async with Sandbox() as box:
            shell = await box.shell()
            result = await shell.run(f"exec python3 -c '{DROP_PDEATHSIG}' {token}", timeout_s=2)
            assert result.timed_out
            await shell.close()
            wait_until(lambda: not host_pids_with(token), 5, "the shell's program to die with the shell")

    arun(go())


@pytest.mark.skipif(shutil.which("gdb") is None, reason="the attack uses gdb from the host's /usr")
def test_a_command_that_ptraces_its_pid_1_still_dies_at_its_timeout() -> None:
    token = f"{uuid.uuid4().int % 100000 + 300000}"

    async def go() -> None:
        async with Sandbox() as box:
            attack = f"gdb -p 1 -batch -ex 'call (int)prctl(1, 0, 0, 0, 0)' >/dev/null 2>&1; exec sleep {token}.5"
            result = await box.run(attack, timeout_s=3)
            assert result.timed_out
            wait_until(lambda: not host_pids_with(f"sleep\0{token}.5"), 5, "the command to die at its timeout")

    arun(go())


def test_a_sparse_file_is_exported_as_the_disk_it_uses() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(disk_mb=16, file_size_mb=64)) as box:
            await box.run("truncate -s 60M /workspace/hole")
            archive = await box.export_workspace()
        assert len(archive) < 1 << 20, f"an empty sparse file became an archive of {len(archive) >> 20} MB"

    arun(go())


def test_a_workspace_the_verifier_cannot_hold_gives_reward_0_not_an_exception(tmp_path: Path) -> None:
    """Sparse files cost the agent no disk; exported in full, they overflow the verifier's disk,
    and ``import_workspace``'s SandboxError ended the step (and the rollout) instead of a reward."""
    generate_tasks(tmp_path, 0, False, prefixes=("files-mkdir_write-",))
    task = sorted(path.name for path in tmp_path.iterdir())[0]

    async def play() -> float:
        env = TerminalEnv(EnvConfig(max_steps=4), tasks_dir=tmp_path)
        env._limits = SandboxLimits(disk_mb=16, file_size_mb=8, command_timeout_s=20)  # small, for speed
        try:
            await env.reset(seed=0, task=task)
            await env.step(shell_action("for i in 1 2 3; do truncate -s 8M /workspace/hole$i; done"))
            return (await env.step(Action(content="done"))).reward
        finally:
            await env.close()

    assert arun(play()) == 0.0


FORGE_MARKER = r"""
rest=""; while IFS= read -r -t 1 line <&10; do rest="$rest$line"$'\n'; done
token=$(printf '%s' "$rest" | grep -o '__CLAWRL_DONE_[0-9a-f]*__' | head -1)
printf '\n%sx\n' "$token"; printf '\n%s0\n' "$token" >&2
"""


def test_a_command_that_forges_the_shells_end_marker_does_not_crash_the_runner() -> None:
    async def go() -> None:
        async with Sandbox() as box:
            shell = await box.shell()
            for _ in range(2):
                result = await shell.run(FORGE_MARKER, timeout_s=10)  # ValueError: invalid literal for int()
                assert result.exit_code != 0 or result.stdout == "", result
                assert (await shell.run("echo still here")).stdout == "still here\n"

    arun(go())


# --- contained, kept so ------------------------------------------------------------------------

COMPAT_CALLS = r"""
#include <stdio.h>
#include <unistd.h>
#include <errno.h>
int main(void) {
    long r = syscall(0x40000000 | 272, 0x10000000);  /* x32 unshare(CLONE_NEWUSER) */
    printf("x32-unshare %ld %d\n", r, errno);
    r = syscall(0x40000000 | 250, 0, -3, 0);  /* x32 keyctl */
    printf("x32-keyctl %ld %d\n", r, errno);
    fflush(stdout);
    long ret;  /* i386 unshare(CLONE_NEWUSER) through int 0x80 */
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(310), "b"(0x10000000) : "memory");
    printf("int80-unshare %ld\n", ret);
    return 0;
}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64" or shutil.which("gcc") is None, reason="x86_64 with gcc")
def test_x32_and_32_bit_system_calls_are_refused(tmp_path: Path) -> None:
    (tmp_path / "compat.c").write_text(COMPAT_CALLS)
    built = subprocess.run(["gcc", "-O2", "-static", "-o", str(tmp_path / "compat"), str(tmp_path / "compat.c")], capture_output=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build a static binary here: {built.stderr.decode()[-200:]}")
    binary = base64.b64encode((tmp_path / "compat").read_bytes()).decode()

    async def go() -> None:
        async with Sandbox() as box:
            for _ in range(2):
                result = await box.run("base64 -d > /tmp/compat && chmod +x /tmp/compat && /tmp/compat; echo status=$?", stdin=binary)
                assert "x32-unshare -1 38" in result.stdout and "x32-keyctl -1 38" in result.stdout, result  # ENOSYS
                assert "int80-unshare" not in result.stdout and "status=159" in result.stdout, result  # SIGSYS

    arun(go())


SYSV_SHM = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for total in range(16, 1024, 16):
    segment = libc.shmget(0, 16 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, never removed: it outlives us
    address = libc.shmat(segment, None, 0)
    if segment < 0 or address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    print(total, flush=True)
"""

SYSV_MSG = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Message(ctypes.Structure):
    _fields_ = [("type", ctypes.c_long), ("text", ctypes.c_char * 8000)]
message, total = Message(1, b"x" * 8000), 0
for queue in range(32000):
    qid = libc.msgget(0, 0o1000 | 0o600)
    if qid < 0 or libc.msgsnd(qid, ctypes.byref(message), 8000, 0o4000) != 0:
        break
    total += 8000
    if queue % 500 == 0:
        print(total >> 20, flush=True)
"""

PIPE_BUFFERS = r"""
import fcntl, os
total, held = 0, []
for _ in range(400):
    read, write = os.pipe()
    try:
        fcntl.fcntl(write, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
    os.set_blocking(write, False)
    try:
        while True:
            total += os.write(write, b"x" * 65536)
    except BlockingIOError:
        pass
    held.append((read, write))
print(total >> 20, flush=True)
"""


@pytest.mark.parametrize("attack", ["shm", "msg", "pipes"])
def test_kernel_memory_of_ipc_and_pipes_is_charged_to_the_sandbox(attack: str) -> None:
    """SysV segments and queues outlive their process, and pipe buffers are kernel memory: all are
    charged to the sandbox's cgroup (memory_mb + disk_mb = 144 MB here)."""
    script = {"shm": SYSV_SHM, "msg": SYSV_MSG, "pipes": PIPE_BUFFERS}[attack]

    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(memory_mb=128, disk_mb=16)) as box:
            needs_cgroup(box)
            held = 0
            for _ in range(2):  # what the first left behind counts against the second
                result = await box.run("python3 -", stdin=script, timeout_s=30)
                held += max((int(word) for word in result.stdout.split()), default=0)
            assert held <= 144 + 16, f"{attack}: {held} MB held with a limit of 144 MB"

    arun(go())


def test_no_vsock_connection_reaches_a_host_listener() -> None:
    """AF_VSOCK is not namespaced: a listener of the host on any CID must stay out of reach."""
    if not hasattr(socket, "AF_VSOCK"):
        pytest.skip("no AF_VSOCK here")
    try:
        listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        listener.bind((socket.VMADDR_CID_ANY, 47000 + uuid.uuid4().int % 1000))
        listener.listen(4)
    except OSError as error:
        pytest.skip(f"no vsock listener here: {error}")
    port = listener.getsockname()[1]
    cids = [1]  # the local loopback transport; never the hypervisor's CID 2
    with contextlib.suppress(OSError):
        device = os.open("/dev/vsock", os.O_RDONLY)
        try:  # IOCTL_VM_SOCKETS_GET_LOCAL_CID
            cids.append(struct.unpack("I", fcntl.ioctl(device, 0x7B9, b"\0" * 4))[0])
        finally:
            os.close(device)
    reached = threading.Event()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            reached.set()
            client.close()

    threading.Thread(target=serve, daemon=True).start()
    attack = (
        f"import socket\nfor cid in {cids}:\n"
        "    try:\n        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); s.settimeout(1)\n"
        f"        s.connect((cid, {port})); print('connected', cid)\n"
        "    except OSError:\n        pass\n"
    )

    async def go() -> None:
        async with Sandbox() as box:
            result = await box.run("python3 -", stdin=attack, timeout_s=20)
            assert "connected" not in result.stdout, result

    try:
        arun(go())
    finally:
        listener.close()
    assert not reached.is_set()


HOSTILE_WORKSPACE = r"""
cd /workspace
mkfifo fifo; mkdir -p locked/in; echo kept > locked/in/f; chmod 000 locked/in locked
touch -- '--checkpoint=1' '--checkpoint-action=exec=touch /tmp/PWNED' $'new\nline' '-rf'
echo a > a; ln a hard; ln -s /tests/test.sh abs; ln -s ../tests up; ln -s /logs/verifier logs
mkdir d; ln -s ../../tests d/up2
"""


def test_a_hostile_workspace_imports_into_the_verifier_without_touching_its_tests() -> None:
    """Fifos, chmod 000 directories, names like options, hard links and links to /tests, /logs."""

    async def go() -> None:
        async with Sandbox() as agent:
            await agent.run(HOSTILE_WORKSPACE)
            archive = await agent.export_workspace()
        async with Sandbox(writable_dirs=("/tests", "/logs")) as verifier:
            await verifier.run("mkdir -p /logs/verifier && echo original > /tests/test.sh")
            await verifier.import_workspace(archive)
            seen = await verifier.run(
                "cat /tests/test.sh; ls -A /logs/verifier /tests | tr '\\n' ' '; echo; "
                "test -e /tmp/PWNED && echo PWNED; cat /workspace/locked/in/f; test -p /workspace/fifo && echo fifo", cwd="/"
            )  # fmt: skip
        lines = seen.stdout.splitlines()
        assert lines[0] == "original" and "PWNED" not in seen.stdout, seen
        assert lines[1].split() == ["/logs/verifier:", "/tests:", "test.sh"], seen
        assert lines[2:] == ["kept", "fifo"], seen

    arun(go())
