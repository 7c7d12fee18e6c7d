"""The sandbox's spawner: a small process of its own that starts every command of one sandbox.

Run by commands.py as ``python -I -S spawner.py RUNNER_PID SOCKET_FD`` on the host while the
sandbox starts (nothing here is looked up through the sandbox's mounts), it imports only the
standard library and is never imported by clawrl. Why a process of its own: a command is entered
by forks of the process that enters it, and forking the runner (a server or a trainer with
PyTorch loaded) copies its page tables and, page by page, whatever the child touches: 60 MB and
80 ms per command where the runner holds PyTorch. This process is a few megabytes.

Protocol, on a SOCK_SEQPACKET socket (one JSON object a message):

* runner -> spawner, first: the sandbox's configuration with its descriptors (see ``main``);
* runner -> spawner: ``{"spawn": ID, "argv": [...], "cwd": ..., "env": {...}}`` with three
  descriptors (the command's stdin, stdout, stderr); ``{"kill": ID}``.
* spawner -> runner: ``{"started": ID}``; ``{"exited": ID, "status": S}`` (an exit status, or
  -N when signal N killed the outermost process). End of file on the socket: the runner is gone,
  and so are its commands.

How a command is entered (``_enter``), three processes in a chain, each waiting for the next:

1. A fork of the spawner (host pid namespace) joins the sandbox's cgroup, enters the base
   namespaces, becomes the base's root, nests a user namespace and a mount namespace, and forks.
2. Its child (in the base pid namespace) nests a pid namespace and forks; it does not die with
   its parent but kills its own child when its parent is gone: the command's pid 1 can clear its
   own parent-death signal (prctl, or its commands through ptrace), but nothing in the command's
   namespace can refuse a SIGKILL from outside it.
3. That child is pid 1 of the command's pid namespace: it mounts the namespace's /proc, nests a
   user, mount and cgroup namespace once more (so that every mount it has is locked), joins a
   fresh keyring, starts a session (no controlling terminal), takes the rlimits and the seccomp
   filter, drops every descriptor but 0-2, and execs the command.

The first two only wait and pass the exit status on (128+N for a death by signal N). The id maps
are written through a descriptor of the host's /proc opened by the runner, so no path inside the
sandbox is resolved before the command's own exec.
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import socket
import sys
from typing import Any, NoReturn

SETUP_EXIT_CODE = 125  # a command whose sandbox could not be entered (the reason is on its stderr)
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x02000000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 1, 4, 38, 22
_SECCOMP_MODE_FILTER = 2
_KEYCTL_JOIN_SESSION_KEYRING = 1
_RLIMITS = {
    "cpu": resource.RLIMIT_CPU, "as": resource.RLIMIT_AS, "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE,
}  # fmt: skip
libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _die_with_parent(parent: int) -> None:
    _check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(126)


def _write_proc(config: dict[str, Any], name: str, text: str) -> None:
    """Write this process's /proc/self/NAME through the host's /proc (no path inside is resolved)."""
    fd = os.open(f"self/{name}", os.O_WRONLY | os.O_CLOEXEC, dir_fd=config["host_proc"])
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _map_root(config: dict[str, Any]) -> None:
    """Map uid and gid 0 of the parent user namespace to 0 in this process's new one."""
    for name, text in (("setgroups", "deny"), ("gid_map", "0 0 1"), ("uid_map", "0 0 1")):
        _write_proc(config, name, text)


def _set_oom_score(config: dict[str, Any], score: int) -> None:
    """Lowering it needs root on the host: a runner that is not root leaves it as it is."""
    try:
        _write_proc(config, "oom_score_adj", str(score))
    except OSError:
        pass


def _fork_and_wait(*, die_with_parent: bool = True, guard: int | None = None) -> int:
    """Fork; the parent waits for the child and exits as it did; the child returns the read end
    of a pipe that reaches end of file when its parent is gone. A parent given ``guard`` (its own
    such pipe) kills the child once ``guard`` ends."""
    alive_read, alive_write = os.pipe()
    child = os.fork()
    if child:
        os.close(alive_read)
        _wait_and_exit(child, [alive_write] + ([guard] if guard is not None else []), guard)
    os.close(alive_write)
    if guard is not None:
        os.close(guard)
    if die_with_parent:
        _check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if select.select([alive_read], [], [], 0)[0]:  # end of file: the parent is gone already
        os._exit(126)
    return alive_read


def _wait_and_exit(child: int, keep: list[int], guard: int | None) -> NoReturn:
    """Hold nothing of the command (its pipes must close when it ends) but `keep`; wait for the
    child (killing it when `guard` ends first); exit as it did."""
    _close_all_but(keep)
    if guard is not None:
        try:
            child_fd = os.pidfd_open(child)
            if child_fd not in select.select([guard, child_fd], [], [])[0]:  # the guard ended first
                os.kill(child, signal.SIGKILL)
        except OSError:  # no pidfd (Linux < 5.3): the parent-death signal alone
            pass
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _close_all_but(keep: list[int]) -> None:
    previous = -1
    for fd in sorted(keep) + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]]:
        if fd > previous + 1:  # closerange(0, 0) would close everything: CPython passes high - 1 to close_range
            os.closerange(previous + 1, fd)
        previous = fd


def _enter(config: dict[str, Any], cwd: str) -> None:
    """Steps 1 to 3 (see the module docstring); only step 3 returns, ready to exec."""
    spawner = os.getppid()
    for fd in config["cgroups"]:
        os.write(fd, b"0")  # 0: the writing process itself; its children follow it
    _set_oom_score(config, -1000)  # the sandbox's OOM kills hit the command, never these waiters
    if os.geteuid() == 0:
        os.setgroups([])  # the host root's supplementary groups must not come along
    for fd, nstype in config["ns"]:
        _check(libc.setns(fd, nstype), "setns")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # the uid change cleared the parent-death signal and made this process non-dumpable, which
    # gives its /proc files (the id maps written below) to the host's root
    _die_with_parent(spawner)
    _check(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    # counted in the base user namespace, this bounds the whole sandbox (the kernel checks a
    # namespace's count against the limit its creator had)
    resource.setrlimit(resource.RLIMIT_NPROC, tuple(config["rlimits"]["nproc"]))
    _check(libc.unshare(_CLONE_NEWUSER), "unshare(user)")
    _map_root(config)
    _check(libc.unshare(_CLONE_NEWNS), "unshare(mount)")
    step_one_alive = _fork_and_wait(die_with_parent=False)  # step 2 from here
    _check(libc.unshare(_CLONE_NEWPID), "unshare(pid)")
    os.close(_fork_and_wait(guard=step_one_alive))  # step 3 from here
    _check(libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount(/proc)")
    _set_oom_score(config, 0)
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWCGROUP), "unshare(user, mount, cgroup)")
    _map_root(config)
    joined = libc.syscall(config["keyctl"], _KEYCTL_JOIN_SESSION_KEYRING, None, 0, 0, 0)
    if joined < 0 and ctypes.get_errno() != errno.ENOSYS:  # ENOSYS: a kernel without keyrings, none to share
        raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING)")
    os.setsid()
    os.chdir(cwd)
    for name, limits in config["rlimits"].items():
        resource.setrlimit(_RLIMITS[name], tuple(limits))
    _install_filter(bytes.fromhex(config["filter"]))


def _install_filter(program: bytes) -> None:
    """no_new_privs, then the seccomp filter (seccomp.py builds it) for this process and its children."""
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")


def _run_command(config: dict[str, Any], request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In a fork of the spawner: the command's pipes on 0-2, then `_enter`, then exec."""
    try:
        signal.set_wakeup_fd(-1)  # the spawner's, not this process's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _enter(config, request["cwd"])
        _close_all_but([0, 1, 2])  # nothing of the runner's (the host's /proc above all) goes in
        os.execve(request["argv"][0], request["argv"], request["env"])
    except BaseException as error:
        os.write(2, f"clawrl sandbox: cannot start the command: {error}\n".encode())
        os._exit(SETUP_EXIT_CODE)


def _serve(config: dict[str, Any]) -> None:
    channel = socket.socket(fileno=config["socket"])
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup descriptor says a child ended
    running: dict[int, int] = {}  # pid -> command id

    def send(message: dict[str, Any]) -> None:
        channel.send(json.dumps(message).encode())

    while True:
        ready = select.select([channel, wake_read], [], [])[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
            while running:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                if pid in running:
                    send({"exited": running.pop(pid), "status": os.waitstatus_to_exitcode(status)})
        if channel in ready:
            data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
            if not data:  # the runner is gone: so are its commands
                for pid in running:
                    os.kill(pid, signal.SIGKILL)
                return
            request = json.loads(data)
            if "spawn" in request:
                pid = os.fork()
                if not pid:
                    _run_command(config, request, fds)
                for fd in fds:
                    os.close(fd)
                running[pid] = request["spawn"]
                send({"started": request["spawn"]})
            elif "kill" in request:
                for pid, command in running.items():
                    if command == request["kill"]:
                        os.kill(pid, signal.SIGKILL)


def main() -> None:
    """argv: the runner's pid and the socket's descriptor. The first message is the sandbox's
    configuration, with its descriptors: the namespaces (in the order of ``config["ns"]``), the
    host's /proc, then the cgroup's ``cgroup.procs`` files."""
    runner, channel_fd = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(runner)
    channel = socket.socket(fileno=channel_fd)
    data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 64)
    if not data:
        return
    config = json.loads(data)
    count = len(config["ns"])
    config["ns"] = [(fd, nstype) for fd, nstype in zip(fds[:count], config["ns"])]
    config["host_proc"], config["cgroups"] = fds[count], fds[count + 1 :]
    config["socket"] = channel_fd
    channel.detach()
    _serve(config)


if __name__ == "__main__":
    main()
