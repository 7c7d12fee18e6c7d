"""The sandbox (issue 13 item 2): isolation, limits, hostile actions, cleanup after SIGKILL.

Every hostile test checks both that the action is contained and that the host is untouched, then
that the sandbox (or a new one) still works.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from clawrl.envs.sandbox import (
    TIMEOUT_EXIT_CODE,
    WORKDIR,
    Sandbox,
    SandboxError,
    SandboxLimits,
    sandbox_available,
)
from tests.helpers import host_pids_with, wait_until

REASON = sandbox_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"sandbox unavailable: {REASON}")
PROJECT_FILE = Path(__file__).resolve()
T = TypeVar("T")


def arun(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def image(tmp_path: Path) -> Path:
    root = tmp_path / "image"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    (root / "sub" / "b.txt").write_text("bee\n")
    return root




def test_root_is_new_and_host_files_are_invisible(image: Path) -> None:
    async def go() -> None:
        async with Sandbox(image) as box:
            who = await box.run("id -u; hostname; pwd; cat a.txt sub/b.txt; python3 -c 'print(6*7)'")
            assert who.stdout.split() == ["0", "sandbox", WORKDIR, "hello", "bee", "42"], who
            listing = await box.run("ls -A /")
            assert set(listing.stdout.split()) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32",
                                                   "proc", "root", "sbin", "tmp", "usr", "workspace"}  # fmt: skip
            for path in ("/etc/shadow", "/home", "/work", str(PROJECT_FILE), str(image), "/root/.bashrc"):
                probe = await box.run(f"cat {path} || ls {path}")
                assert probe.exit_code != 0, (path, probe)
            assert (await box.run("ls -A /root")).stdout == ""
            # the sandbox's root owns the image's files (when idmapped) and edits land in the upper layer
            edit = await box.run("echo changed > a.txt && cat a.txt")
            assert edit.stdout == "changed\n", edit

    arun(go())
    assert (image / "a.txt").read_text() == "hello\n"


def test_fork_bomb_is_contained() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(processes=32)) as box:
            bomb = await box.run("bomb() { bomb | bomb & }; bomb; sleep 3", timeout_s=2)
            assert bomb.timed_out and "fork" in bomb.stderr  # it ran into the process limit
            assert (await box.run("echo alive")).stdout == "alive\n"
            count = await box.run("ls /proc | grep -c '^[0-9]'")
            assert int(count.stdout) < 8, count  # the bomb's processes died with its command

    start = time.monotonic()
    arun(go())
    assert time.monotonic() - start < 20
    assert not host_pids_with("bomb()")


def test_rm_rf_root_leaves_host_and_image_intact(image: Path) -> None:
    async def go() -> None:
        async with Sandbox(image) as box:
            await box.run("rm -rf --no-preserve-root / 2>/dev/null")
            assert (await box.run("ls /workspace")).stdout == ""
            await box.reset()
            assert (await box.run("cat a.txt")).stdout == "hello\n"
            assert (await box.run("python3 -c 'print(1)'")).stdout == "1\n"

    arun(go())
    assert (image / "a.txt").read_text() == "hello\n"
    assert PROJECT_FILE.exists() and Path("/usr/bin/env").exists() and Path("/etc/passwd").exists()


def test_writes_outside_do_not_reach_the_host() -> None:
    token = uuid.uuid4().hex
    targets = [Path(f"/tmp/clawrl-escape-{token}"), PROJECT_FILE.parent / f"escape-{token}", Path(f"/root/{token}")]

    async def go() -> None:
        async with Sandbox() as box:
            for target in targets:
                await box.run(f"mkdir -p {target.parent} && echo x > {target}")
            assert (await box.run("touch /usr/evil /etc/evil")).exit_code != 0  # read-only system dirs

    arun(go())
    assert not any(target.exists() for target in targets)
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()


def test_network_is_loopback_only() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host_port = listener.getsockname()[1]
    connect = "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)'"

    async def go() -> None:
        async with Sandbox() as box:
            assert (await box.run(f"{connect} 127.0.0.1 {host_port}")).exit_code != 0
            assert (await box.run(f"{connect} 1.1.1.1 53")).exit_code != 0
            assert "lo" in (await box.run("ls /sys/class/net 2>/dev/null || ip -o link")).stdout
            local = await box.run(
                "python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &"
                "for try in $(seq 100); do python3 -c 'import urllib.request; "
                "print(urllib.request.urlopen(\"http://127.0.0.1:8000/\").status)' 2>/dev/null && break; sleep 0.05; done"
            )
            assert local.stdout.strip() == "200", local

    try:
        arun(go())
    finally:
        listener.close()


def test_filling_the_disk_stops_at_the_limit() -> None:
    free_before = shutil.disk_usage("/tmp").free

    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(disk_mb=16)) as box:
            fill = await box.run("for f in /workspace/big /tmp/big; do dd if=/dev/zero of=$f bs=1M count=64; done")
            assert "No space left" in fill.stderr, fill
            used = await box.run("du -sm /workspace/big /tmp/big | awk '{s+=$1} END {print s}'")
            assert int(used.stdout) <= 16
            await box.run("rm /workspace/big /tmp/big")
            assert (await box.run("echo ok > /workspace/f && cat /workspace/f")).stdout == "ok\n"

    arun(go())
    assert abs(shutil.disk_usage("/tmp").free - free_before) < 32 * 1024 * 1024


def test_file_size_limit() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(file_size_mb=1)) as box:
            big = await box.run("head -c 2000000 /dev/zero > /tmp/f")
            assert big.exit_code != 0
            assert int((await box.run("stat -c %s /tmp/f")).stdout) <= 1024 * 1024

    arun(go())


def test_timeout_kills_the_whole_tree_even_setsid_and_sigterm_ignoring() -> None:
    token = f"{uuid.uuid4().int % 1000}.{os.getpid()}"  # a unique sleep length to find it by

    async def go() -> None:
        async with Sandbox() as box:
            start = time.monotonic()
            stubborn = await box.run(
                f"trap '' TERM; setsid bash -c \"trap '' TERM; sleep {token}\" & sleep {token}", timeout_s=1
            )
            assert stubborn.timed_out and stubborn.exit_code == TIMEOUT_EXIT_CODE
            assert time.monotonic() - start < 8
            wait_until(lambda: not host_pids_with(f"sleep {token}"), 10, "the sandboxed sleeps to be gone")
            with pytest.raises(asyncio.TimeoutError):  # a caller that gives up kills the command too
                await asyncio.wait_for(box.run(f"sleep {token}"), 0.5)
            wait_until(lambda: not host_pids_with(f"sleep {token}"), 10, "the sandboxed sleeps to be gone")
            assert (await box.run("echo fine")).stdout == "fine\n"

    arun(go())


def test_memory_hog_is_stopped_by_the_address_space_limit() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(memory_mb=256)) as box:
            hog = await box.run("python3 -c 'x = bytearray(1024 * 1024 * 1024)'")
            assert hog.exit_code != 0 and "MemoryError" in hog.stderr, hog
            assert not hog.timed_out

    arun(go())


def test_cpu_hog_is_stopped_by_the_cpu_limit() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(cpu_seconds=1)) as box:
            hog = await box.run("python3 -c 'while True: pass'", timeout_s=20)
            assert not hog.timed_out
            assert hog.exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL), hog

    arun(go())


RUNNER = """
import asyncio, sys
from clawrl.envs.sandbox import Sandbox
async def main():
    box = Sandbox()
    await box.start()
    shell = await box.shell()
    await shell.run("sleep {token} &")
    print(box._init.pid, " ".join(map(str, box.cgroup_paths)), flush=True)
    await box.run("sleep {token}", timeout_s=600)
asyncio.run(main())
"""


def test_sigkill_of_the_runner_leaves_nothing_behind(tmp_path: Path) -> None:
    token = f"{uuid.uuid4().int % 1000 + 1000}.{os.getpid()}"
    temp = tmp_path / "runner-tmp"  # the runner's TMPDIR: any temporary directory would land here
    temp.mkdir()
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER.format(token=token)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    assert runner.stdout
    init_pid, *cgroups = runner.stdout.readline().split()
    wait_until(lambda: len(host_pids_with(f"sleep {token}")) >= 2, 10, "both sleeps to run")
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    wait_until(lambda: not host_pids_with(f"sleep {token}"), 10, "the sandboxed sleeps to be gone")
    wait_until(lambda: not Path(f"/proc/{init_pid}").exists(), 10, "the sandbox's init to exit")
    assert "clawrl" not in Path("/proc/self/mountinfo").read_text()
    assert not list(temp.iterdir())

    # the killed runner's cgroup directories (empty now) go when the next sandbox starts
    async def next_sandbox() -> None:
        async with Sandbox() as box:
            assert (await box.run("echo ok")).stdout == "ok\n"

    arun(next_sandbox())
    assert not [group for group in cgroups if Path(group).exists()], cgroups


def test_reset_gives_a_fresh_layer(image: Path) -> None:
    async def go() -> None:
        async with Sandbox(image) as box:
            await box.write_file(f"{WORKDIR}/new/deep.txt", "dé\n")
            assert await box.read_file(f"{WORKDIR}/new/deep.txt") == "dé\n"
            await box.run("rm a.txt; echo x > /tmp/x; sleep 300 &")
            await box.reset()
            assert (await box.run("ls -A; ls -A /tmp")).stdout == "a.txt\nsub\n"
            with pytest.raises(SandboxError, match="cannot read"):
                await box.read_file(f"{WORKDIR}/new/deep.txt")

    arun(go())


def test_shell_keeps_state_and_survives_a_timeout() -> None:
    async def go() -> None:
        async with Sandbox() as box:
            shell = await box.shell()
            await shell.run("cd /tmp && export GREETING=hi && f() { echo \"f:$1\"; }")
            state = await shell.run("pwd; echo $GREETING; f x; printf 'no newline'")
            assert state.stdout == "/tmp\nhi\nf:x\nno newline"
            failed = await shell.run("echo oops >&2; false")
            assert (failed.exit_code, failed.stderr) == (1, "oops\n")
            slow = await shell.run("sleep 30", timeout_s=0.5)
            assert slow.timed_out and slow.exit_code == TIMEOUT_EXIT_CODE
            assert (await shell.run("echo back; pwd")).stdout == f"back\n{WORKDIR}\n"  # a new shell
            ended = await shell.run("exit 3")
            assert ended.exit_code == 3
            assert (await shell.run("echo again")).stdout == "again\n"
            await shell.close()

    arun(go())


def test_a_shell_closed_right_after_it_opens_is_gone() -> None:
    """An agent that finishes at its first step closes its shell at once: the shell must not
    outlive that (it once escaped the kill chain now and then, and closing it hung for ever)."""

    async def open_and_close(box: Sandbox) -> None:
        for _ in range(30):
            shell = await box.shell()
            await asyncio.wait_for(shell.close(), 10)

    async def go() -> None:
        async with Sandbox() as box, Sandbox() as other:  # two at a time, as rollouts run: a busier machine
            await asyncio.gather(open_and_close(box), open_and_close(other))
            # gone, not escaped: a killed shell's last moments (its exit reported, its namespace's
            # process not yet torn down) may show for a few milliseconds on a loaded machine, an
            # escaped one stays (it outlived its sandbox for good before)
            for _ in range(40):
                if not host_pids_with("--noprofile"):
                    break
                await asyncio.sleep(0.05)
            assert host_pids_with("--noprofile") == []
            assert (await box.run("echo still here")).stdout == "still here\n"

    arun(go())


def test_concurrent_sandboxes_are_isolated() -> None:
    async def one(index: int) -> tuple[str, str, str]:
        async with Sandbox() as box:
            await box.write_file("/tmp/who", str(index))
            shell = await box.shell()
            await shell.run(f"sleep 1{index}.5 &")
            sleeps = await shell.run("for try in $(seq 100); do ps -eo args | grep '^sleep' && break; sleep 0.05; done")
            files = await box.run("cat /tmp/who; ls /workspace")
            return str(index), sleeps.stdout.strip(), files.stdout

    async def all_four() -> list[tuple[str, str, str]]:
        return await asyncio.gather(*(one(index) for index in range(4)))

    results = arun(all_four())
    for index, sleeps, files in results:
        assert sleeps == f"sleep 1{index}.5"
        assert files == index  # its own /tmp and an empty workspace


def test_bad_input_gives_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="not a directory"):
        Sandbox(tmp_path / "missing")
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxLimits(cpu_seconds=0)

    async def go() -> None:
        box = Sandbox()
        with pytest.raises(SandboxError, match="not running"):
            await box.run("true")
        async with box:
            with pytest.raises(ValueError, match="absolute"):
                await box.run("true", cwd="relative")
            with pytest.raises(ValueError, match="timeout_s"):
                await box.run("true", timeout_s=0)
            assert (await box.run("cat", stdin="piped")).stdout == "piped"
        await box.close()
        with pytest.raises(SandboxError, match="not running"):
            await box.run("true")

    arun(go())


def test_many_quick_commands_at_once_all_end_with_their_own_status() -> None:
    """Concurrent commands of one sandbox each get their own exit status."""

    async def go() -> None:
        async with Sandbox() as box:
            for _ in range(4):  # twelve at a time: each holds four processes of the sandbox's 64
                results = await asyncio.wait_for(asyncio.gather(*(box.run(f"exit {i}") for i in range(12))), 60)
                assert [result.exit_code for result in results] == list(range(12)), [r.stderr for r in results]

    arun(go())
