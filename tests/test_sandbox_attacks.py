"""Red team of the sandbox (issue 26): each attack as the code an agent's tool call runs would try it.

The first group escaped the sandbox of issue 13 (each test here failed on it): typing into the
runner's terminal, taking over the sandbox's base mount namespace (and through it the runner and
the verifier), reading the runner's keyring, and limits that held per process only. The second
group was contained then and must stay so. Each test checks what an attacker would look for
(an injected keystroke, a command run on the host side, a key's text, bytes past a limit).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import termios
import threading
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from clawrl.config import EnvConfig
from clawrl.envs.protocol import Action
from clawrl.envs.sandbox import OUTPUT_LIMIT, Sandbox, SandboxError, SandboxLimits, sandbox_available, seccomp
from clawrl.envs.terminal.env import TerminalEnv
from tests.helpers import host_pids_with, wait_until

REASON = sandbox_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"sandbox unavailable: {REASON}")
T = TypeVar("T")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="outer ids of their own need a root runner")


def arun(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]




def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def needs_cgroup(box: Sandbox) -> None:
    if box.confinement.startswith("no cgroup"):
        pytest.skip(f"this host gives the sandbox no cgroup: {box.confinement}")


# --- 1. the terminal -------------------------------------------------------------------------

TTY_ATTACK = r"""
import fcntl, os, termios
found = []
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    found.append("opened /dev/tty")
    fcntl.ioctl(tty, termios.TIOCSTI, b"X")
    found.append("TIOCSTI on /dev/tty worked")
except OSError as error:
    found.append(f"/dev/tty: {error.strerror}")
for fd in (0, 1, 2):
    for name, request in (("TIOCSTI", termios.TIOCSTI), ("TIOCLINUX", 0x541C)):
        try:
            fcntl.ioctl(fd, request, b"Y\0\0\0")
            found.append(f"{name} on {fd} worked")
        except OSError as error:
            found.append(f"{name} on {fd}: {error.errno}")
print(";".join(found))
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
print("tty_nr", fields[4], "sid", os.getsid(0))
"""

TTY_RUNNER = """
import asyncio, os, select, sys
from clawrl.envs.sandbox import Sandbox
async def main():
    async with Sandbox() as box:
        result = await box.run("python3 -c " + __import__("shlex").quote(sys.argv[1]))
    print(result.stdout.strip().replace("\\n", "|"), flush=True)
    ready, _, _ = select.select([0], [], [], 1.0)
    typed = os.read(0, 100) if ready else b""
    print("typed:", typed.decode(errors="replace"), flush=True)
asyncio.run(main())
"""


def test_a_command_cannot_type_into_the_runners_terminal(tmp_path: Path) -> None:
    """The runner owns a terminal (as a person's shell does); a command finds none to type into."""
    controller, terminal = os.openpty()
    attributes = termios.tcgetattr(terminal)
    attributes[3] &= ~(termios.ICANON | termios.ECHO)  # bytes reach a reader at once, none echoed
    termios.tcsetattr(terminal, termios.TCSANOW, attributes)

    def own_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    runner = subprocess.Popen(
        [sys.executable, "-c", TTY_RUNNER, TTY_ATTACK], stdin=terminal, stdout=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=own_the_terminal,
    )  # fmt: skip
    os.close(terminal)
    try:
        out, _ = runner.communicate(timeout=60)
    finally:
        os.close(controller)
    report, typed = out.strip().splitlines()[-2:]
    assert typed == "typed:", f"the command typed into the runner's terminal: {out}"
    assert "/dev/tty: No such file or directory" in report, report
    eperm = str(errno.EPERM)
    for fd in (0, 1, 2):  # refused by the filter, not merely "not a terminal" (ENOTTY)
        assert f"TIOCSTI on {fd}: {eperm}" in report and f"TIOCLINUX on {fd}: {eperm}" in report, report
    tty_nr, sid = report.split("|")[-1].split()[1::2]
    assert tty_nr == "0", f"the command has a controlling terminal: {report}"
    assert sid == "1", f"the command is not in a session of its own: {report}"


# --- 2. the sandbox's own machinery ----------------------------------------------------------

TAKEOVER = r"""
cp /usr/bin/unshare /tmp/unshare.real 2>/dev/null
printf '#!/bin/sh\necho owned > /tmp/owned\nexec /tmp/unshare.real "$@"\n' > /tmp/evil; chmod +x /tmp/evil
umount -l /proc 2>/dev/null; echo "umount=$?"
echo "pid1=$(head -c 12 /proc/1/cmdline | tr '\0' _)"
nsenter --mount=/proc/1/ns/mnt -- mount --bind /tmp/evil /usr/bin/unshare 2>/dev/null; echo "nsenter=$?"
mount --bind /tmp/evil /usr/bin/unshare 2>/dev/null; echo "bind=$?"
mount --bind /tmp/evil /usr/bin/tar 2>/dev/null; echo "bind_tar=$?"
mount -o remount,rw / 2>/dev/null; echo "remount=$?"
"""


def test_a_command_cannot_reach_the_base_mount_namespace_or_what_the_runner_runs() -> None:
    binaries = ("/usr/bin/unshare", "/usr/bin/tar", "/bin/bash")
    host_digests = [hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in binaries]

    async def go() -> None:
        async with Sandbox() as box:
            attack = await box.run(TAKEOVER)
            values = dict(line.split("=") for line in attack.stdout.split())
            assert values["umount"] != "0" and values["nsenter"] != "0", attack
            assert values["bind"] != "0" and values["bind_tar"] != "0" and values["remount"] != "0", attack
            # /proc still shows the command's own processes (its pid 1 is the command's shell)
            assert values["pid1"] == "/bin/bash_-c", attack
            for _ in range(2):  # the runner starts further commands and a shell
                after = await box.run("test -e /tmp/owned && echo owned; sha256sum /usr/bin/unshare /usr/bin/tar /bin/bash")
                assert "owned" not in after.stdout.split("\n")[0], "the runner ran the agent's binary"
                assert [line.split()[0] for line in after.stdout.split("\n") if line] == host_digests
            shell = await box.shell()
            assert (await shell.run("test -e /tmp/owned && echo owned || echo clean")).stdout.strip() == "clean"

    arun(go())


def test_the_sandbox_level_proc_and_init_are_out_of_sight(tmp_path: Path) -> None:
    image = tmp_path / "image-with-a-host-path-name"
    image.mkdir()
    (image / "a.txt").write_text("a\n")

    async def go() -> None:
        async with Sandbox(image) as box:
            seen = await box.run(
                "umount /proc 2>/dev/null; for p in /proc/[0-9]*; do echo \"$p $(tr '\\0' ' ' < $p/cmdline)\"; done; "
                "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; ls -l /proc/[0-9]*/fd/ /proc/[0-9]*/cwd 2>/dev/null"
            )
        assert "while read" not in seen.stdout and "unshare" not in seen.stdout, seen.stdout
        assert "CLAWRL" not in seen.stdout, seen.stdout  # the init's environment is not in view
        for host_path in (str(tmp_path), os.getcwd()):
            assert host_path not in seen.stdout, (host_path, seen.stdout)
        pid_lines = [line for line in seen.stdout.splitlines() if line.startswith("/proc/") and " " in line and line.split()[0].count("/") == 2]
        assert pid_lines[0].startswith("/proc/1 /bin/bash -c"), seen.stdout  # pid 1 is the command's own

    arun(go())


@ROOT_ONLY
def test_every_sandbox_runs_as_an_outer_uid_of_its_own_and_signals_reach_nothing_outside() -> None:
    token = f"{uuid.uuid4().int % 100000 + 100000}"
    host_sleeper = subprocess.Popen(["sleep", f"{token}.5"], preexec_fn=lambda: os.setuid(65534))

    async def go() -> None:
        async with Sandbox() as first, Sandbox() as second:
            shells = [await first.shell(), await second.shell()]
            for index, shell in enumerate(shells):
                await shell.run(f"sleep {token}.{index + 1} &")
            wait_until(lambda: len(host_pids_with(f"sleep\0{token}.")) >= 3, 10, "the sleepers")
            uids = {index: host_uid(host_pids_with(f"sleep\0{token}.{index + 1}")[0]) for index in range(2)}
            assert uids[0] != uids[1], uids
            assert not {uids[0], uids[1]} & {0, 65534, os.geteuid()}, uids
            assert (first.outer_uid, second.outer_uid) == (uids[0], uids[1])
            # kill everything the first sandbox may signal, from a fresh command
            await first.run("kill -9 -1; python3 -c 'import os\nfor pid in range(2, 70000):\n try: os.kill(pid, 9)\n except OSError: pass'")
            assert host_pids_with(f"sleep\0{token}.2"), "the other sandbox's process was killed"
            assert host_sleeper.poll() is None, "a host process running as nobody was killed"

    try:
        arun(go())
    finally:
        host_sleeper.kill()
        host_sleeper.wait()


# --- 3. the verifier -------------------------------------------------------------------------

FAKE_TAR = r"""
cat > /tmp/faketar <<'EOF'
#!/bin/bash
mkdir -p /tests /logs/verifier
printf '#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n' > /tests/test.sh
cat > /dev/null
EOF
chmod +x /tmp/faketar
umount -l /proc 2>/dev/null
nsenter --mount=/proc/1/ns/mnt -- mount --bind /tmp/faketar /usr/bin/tar 2>/dev/null
mount --bind /tmp/faketar /usr/bin/tar 2>/dev/null
mkdir -p /logs/verifier 2>/dev/null && echo 1 > /logs/verifier/reward.txt
(sleep 0.5; while true; do mkdir -p /logs/verifier 2>/dev/null && echo 1 > /logs/verifier/reward.txt; sleep 0.05; done) > /dev/null 2>&1 &
echo 1 > /workspace/reward.txt; ln -s /logs/verifier/reward.txt /workspace/link.txt
true
"""


def shell_action(command: str) -> Action:
    arguments = json.dumps({"command": command})
    return Action.model_validate({"tool_calls": [{"id": "s1", "type": "function", "function": {"name": "shell", "arguments": arguments}}]})


@pytest.mark.parametrize("solved", [False, True])
def test_an_agent_that_subverts_its_sandbox_still_gets_what_its_work_earns(tmp_path: Path, solved: bool) -> None:
    """The issue's verifier attack (a fake tar over the real one, reached through the base mount
    namespace), a reward file written in advance and a background writer of one: reward 0 on the
    unsolved task; the same episode with the task solved still gets 1."""
    task = tmp_path / "tasks" / "double"
    (task / "tests").mkdir(parents=True)
    (task / "environment" / "workspace").mkdir(parents=True)
    (task / "environment" / "workspace" / "seed.txt").write_text("3\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 20\n')
    (task / "instruction.md").write_text("Double the number in seed.txt into out.txt.\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ \"$(cat /workspace/out.txt 2>/dev/null)\" = 6 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )

    async def play() -> float:
        env = TerminalEnv(EnvConfig(max_steps=4), tasks_dir=tmp_path / "tasks")
        await env.reset(seed=0, task="double")
        await env.step(shell_action(FAKE_TAR + ("echo 6 > /workspace/out.txt" if solved else "")))
        result = await env.step(Action(content="done"))
        await env.close()
        return result.reward

    assert arun(play()) == (1.0 if solved else 0.0)


# --- 4. the keyring --------------------------------------------------------------------------

KEYRING_RUNNER = """
import asyncio, ctypes, sys
from clawrl.envs.sandbox import Sandbox, seccomp
libc = ctypes.CDLL(None, use_errno=True)
KEY_SPEC_SESSION_KEYRING = -3
libc.syscall(seccomp.syscall_number("keyctl"), 1, None)  # a session keyring of this runner's own
key = libc.syscall(seccomp.syscall_number("add_key"), b"user", sys.argv[1].encode(), b"runner-secret", 13, KEY_SPEC_SESSION_KEYRING)
assert key > 0, ctypes.get_errno()
ATTACK = '''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
numbers = dict(x86_64=(248, 250), aarch64=(217, 219))[__import__("platform").machine()]
planted = libc.syscall(numbers[0], b"user", b"planted-by-episode", b"x", 1, -3)
print("add_key", planted, ctypes.get_errno())
print("keyctl", libc.syscall(numbers[1], 0, -3, 0), ctypes.get_errno())
print(open("/proc/keys").read())
'''
async def main():
    for episode in range(2):
        async with Sandbox() as box:
            result = await box.run("python3 -", stdin=ATTACK)
        print("INSIDE>>>", result.stdout, result.stderr, "<<<INSIDE")
asyncio.run(main())
print("HOST>>>", open("/proc/keys").read())
"""


def test_the_runners_keyring_is_out_of_reach_and_episodes_share_none() -> None:
    secret = f"clawrl-secret-{uuid.uuid4().hex[:12]}"
    out = subprocess.run([sys.executable, "-c", KEYRING_RUNNER, secret], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    inside, host = out.stdout.split("HOST>>>")
    assert secret in host  # the runner's own key is there to be found
    assert secret not in inside, "a sandboxed command saw the runner's key"
    assert inside.count(f"add_key -1 {errno.EPERM}") == 2 and inside.count(f"keyctl -1 {errno.EPERM}") == 2, inside
    assert "planted-by-episode" not in host


# --- 5. limits per sandbox -------------------------------------------------------------------

HOLDERS = """
for i in 1 2 3 4; do
  python3 -c 'import time; block = b"x" * (120 << 20); print("held", flush=True); time.sleep(3); print("released", flush=True)' &
done
wait
"""


def test_memory_is_bounded_for_the_whole_sandbox_not_per_process() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(memory_mb=256, disk_mb=16, processes=64)) as box:
            needs_cgroup(box)
            result = await box.run(HOLDERS, timeout_s=60)
        # four processes of 120 MB each fit a 256 MB limit per process; two at most fit the sandbox
        assert result.stdout.count("released") <= 2, result

    arun(go())


def test_a_tmpfs_mounted_inside_is_refused_and_the_disk_limit_holds() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(disk_mb=16)) as box:
            mounted = await box.run("mkdir -p /tmp/big && mount -t tmpfs -o size=1g none /tmp/big && echo mounted")
            assert "mounted" not in mounted.stdout, mounted
            filled = await box.run("dd if=/dev/zero of=/tmp/big/fill bs=1M count=64 2>&1; du -sm /tmp/big | cut -f1")
            assert int(filled.stdout.split()[-1]) <= 16, filled

    arun(go())


def test_cpu_time_is_bounded_for_the_whole_sandbox() -> None:
    busy = "import time\nend = time.time() + 2\nwhile time.time() < end: pass\nprint(time.process_time())"
    command = f"for i in 1 2; do python3 -c '{busy}' & done; wait"

    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(cpus=0.25)) as box:
            needs_cgroup(box)
            result = await box.run(command, timeout_s=30)
        used = sum(float(line) for line in result.stdout.split())
        assert used < 1.0, f"two busy processes used {used:.2f} CPU seconds in 2 s at 0.25 CPUs"  # about 0.5

    arun(go())


SPAWNER = """
import subprocess
started = []
try:
    for _ in range(30):
        started.append(subprocess.Popen(["sleep", "60"]))
except OSError:
    pass
print(len(started))
"""


def test_processes_are_counted_for_the_whole_sandbox() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(processes=40)) as box:
            shell = await box.shell()
            await shell.run("for i in $(seq 20); do sleep 60 & done")
            second = await box.run("python3 -", stdin=SPAWNER, timeout_s=20)
            # the shell's 20 and the runner's few leave this command well under 20 more
            assert second.exit_code == 0 and 0 < int(second.stdout.split()[-1]) < 20, second

    arun(go())


def test_open_files_are_limited() -> None:
    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(open_files=256)) as box:
            result = await box.run("ulimit -Hn; ulimit -n 100000 2>/dev/null && echo raised")
        assert result.stdout.split() == ["256"], result

    arun(go())


# --- the web relay's socket -----------------------------------------------------------------

LISTENER = r"""
python3 -c '
import os, socket
s = socket.socket(socket.AF_UNIX); s.bind("/tmp/relay.sock.new"); s.listen(4); os.rename("/tmp/relay.sock.new", "/tmp/relay.sock")
while True:
    c, _ = s.accept(); c.sendall(b"inside"); c.close()
' > /dev/null 2>&1 &
"""


def test_a_socket_the_host_connects_to_is_pinned_and_never_a_symlink(tmp_path: Path) -> None:
    host_socket = tmp_path / "host.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(host_socket))
    listener.listen(4)
    reached_host = threading.Event()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            reached_host.set()
            client.close()

    threading.Thread(target=serve, daemon=True).start()

    def read(path: str) -> bytes:
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(5)
            client.connect(path)
            return client.recv(100)

    async def go() -> None:
        async with Sandbox() as box:
            shell = await box.shell()
            await shell.run(LISTENER)
            await box.run("ln -s /tmp/relay.sock /tmp/link.sock; mkdir /tmp/d; ln -s /tmp/d /tmp/dirlink")
            wait_until(lambda: "relay.sock" in os.listdir(f"/proc/{box._init.pid}/root/tmp"), 10, "the listener")  # type: ignore[union-attr]
            path = box.socket_path("/tmp/relay.sock")
            assert await asyncio.to_thread(read, path) == b"inside"
            # the attacker puts a link to a host socket where the socket was
            await box.run(f"rm /tmp/relay.sock && ln -s {host_socket} /tmp/relay.sock")
            assert await asyncio.to_thread(read, path) == b"inside"
            for bad in ("/tmp/relay.sock", "/tmp/link.sock", "/tmp/dirlink/x", "/tmp/../tmp/x", "tmp/x", "/tmp/d"):
                with pytest.raises(SandboxError):
                    box.socket_path(bad)
        assert not reached_host.is_set(), "the host followed a link the sandbox made"

    try:
        arun(go())
    finally:
        listener.close()


# --- contained then, kept so --------------------------------------------------------------------

CONTAINED = {
    "mknod": "mknod /tmp/disk b 8 0",
    "the clock": "date -s '2001-01-01'",
    "kernel modules": "python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).syscall(175 if __import__(\"platform\").machine()==\"x86_64\" else 105, 0, 0, b\"\"))'",
    "sysfs": "mkdir -p /tmp/m && mount -t sysfs sysfs /tmp/m",
    "cgroupfs": "mkdir -p /tmp/m && mount -t cgroup2 none /tmp/m",
    "bpffs": "mkdir -p /tmp/m && mount -t bpf bpf /tmp/m",
    "a user namespace": "unshare --user --map-root-user true",
    "DNS": "getent hosts pypi.org",
    "the host's loopback": "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 22), timeout=2)'",
    "a setuid binary": "test -u /usr/bin/su && su -c 'echo elevated' nobody | grep -q elevated",
    "the host's files": "cat /etc/shadow /root/.bash_history",
}


@pytest.mark.parametrize("attack", sorted(CONTAINED))
def test_contained_attacks_stay_contained(attack: str) -> None:
    async def go() -> None:
        async with Sandbox() as box:
            result = await box.run(CONTAINED[attack], timeout_s=20)
            assert result.exit_code != 0, (attack, result)
            assert (await box.run("echo still here")).stdout == "still here\n"

    arun(go())


def test_a_double_forked_daemon_dies_with_its_command() -> None:
    token = f"{uuid.uuid4().int % 100000 + 200000}"

    async def go() -> None:
        async with Sandbox() as box:
            result = await box.run(f"(setsid nohup sleep {token} > /dev/null 2>&1 &) ; echo started")
            assert result.stdout == "started\n"
            wait_until(lambda: not host_pids_with(f"sleep {token}"), 10, "the daemon to die with its command")

    arun(go())


def test_a_flood_of_output_is_cut_and_the_runner_survives() -> None:
    async def go() -> None:
        async with Sandbox() as box:
            result = await box.run("head -c 200000000 /dev/zero | tr '\\0' x", timeout_s=60)
            assert len(result.stdout) < OUTPUT_LIMIT + 100 and "more bytes dropped" in result.stdout

    arun(go())


def test_the_filter_names_an_architecture_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.filter_program("riscv64")
    assert len(seccomp.filter_program("x86_64")) % 8 == 0 and len(seccomp.filter_program("aarch64")) % 8 == 0


def test_without_a_cgroup_the_sandbox_says_so_and_still_bounds_processes_and_disk(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from clawrl.envs import sandbox
    from clawrl.envs.sandbox import cgroup

    monkeypatch.setattr(cgroup, "_trees_cache", ["cgroups are off in this test"])
    monkeypatch.setattr(sandbox, "_cgroup_warning_logged", [])

    async def go() -> None:
        async with Sandbox(limits=SandboxLimits(processes=24, disk_mb=16)) as box:
            assert box.confinement.startswith("no cgroup (cgroups are off in this test)") and box.cgroup_paths == []
            spawned = await box.run("python3 -", stdin=SPAWNER, timeout_s=20)
            assert 0 < int(spawned.stdout) < 24, spawned
            mounted = await box.run("mkdir -p /tmp/big && mount -t tmpfs none /tmp/big && echo mounted")
            assert "mounted" not in mounted.stdout

    with caplog.at_level("WARNING"):
        arun(go())
    assert "sandboxes run without a cgroup: no cgroup (cgroups are off in this test)" in caplog.text
