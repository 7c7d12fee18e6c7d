"""The system-call filter every sandboxed command runs under (seccomp BPF, built by hand).

What it refuses, and why (issue 26; docs/environments.md, "Threat model"):

* ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)``: both push characters into a terminal's input, so a
  command holding any terminal could type commands into the shell that owns it. Commands have no
  terminal at all (their own session, no /dev/tty); this is the second lock on the same door.
  Only the low 32 bits of the request are compared, as the kernel reads only those.
* ``keyctl``, ``add_key``, ``request_key``: the kernel keyring is shared by uid and inherited by
  session, outside every namespace we make.
* every way to change mounts (``mount``, ``umount2``, ``pivot_root``, the new mount API): a
  command may not cover a binary the runner or a verifier runs, uncover the sandbox's own
  ``/proc``, or mount a tmpfs that no disk limit bounds.
* every way to make or enter a namespace (``unshare``, ``setns``, namespace flags of ``clone``;
  ``clone3``, whose flags sit in memory a filter cannot read, answers ENOSYS so that the C library
  falls back to ``clone``): a fresh user namespace is the door to most kernel attack surface.
* ``socket`` of any family but Unix, IPv4, IPv6 and netlink (EAFNOSUPPORT): some families are
  not confined by a network namespace (``AF_VSOCK`` reaches the hypervisor and its other guests),
  and the rest are kernel surface no task needs.
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module and kexec calls,
  ``open_by_handle_at``, ``syslog``, ``acct``, ``swapon``/``swapoff``, ``quotactl``, ``reboot``,
  ``lookup_dcookie``, ``iopl``/``ioperm``: kernel surface no task needs.

Anything else is allowed. A call of another architecture (32-bit x86 through ``int 0x80``) kills
the process; x32 calls get ENOSYS. The filter knows x86_64 and aarch64; ``filter_program`` names
the architecture it does not know. spawner.py installs it in each command just before its exec.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little endian)
_NR_OFFSET, _ARCH_OFFSET, _ARGS_OFFSET = 0, 4, 16
# classic BPF opcodes
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_SYSCALL_BIT = 0x40000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# the namespace flags of clone(2) (CLONE_NEWTIME is left out: in clone's flags that bit is part of
# the exit signal, so it cannot make a namespace there)
_CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK


class _Arch:
    def __init__(self, audit_arch: int, numbers: dict[str, int], x32: bool) -> None:
        self.audit_arch = audit_arch
        self.numbers = numbers
        self.x32 = x32


# syscall numbers of the calls named here; 424 and up are the same on every architecture
_COMMON = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
    "mount_setattr": 442,
}  # fmt: skip
_ARCHES = {
    "x86_64": _Arch(0xC000003E, {
        **_COMMON, "ioctl": 16, "socket": 41, "clone": 56, "syslog": 103, "pivot_root": 155, "acct": 163, "mount": 165,
        "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
        "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "open_by_handle_at": 304, "setns": 308, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323,
    }, x32=True),
    "aarch64": _Arch(0xC00000B7, {
        **_COMMON, "ioctl": 29, "socket": 198, "clone": 220, "syslog": 116, "pivot_root": 41, "acct": 89, "mount": 40,
        "umount2": 39, "swapon": 224, "swapoff": 225, "reboot": 142, "init_module": 105, "delete_module": 106,
        "quotactl": 60, "lookup_dcookie": 18, "kexec_load": 104, "add_key": 217, "request_key": 218,
        "keyctl": 219, "unshare": 97, "perf_event_open": 241, "open_by_handle_at": 265, "setns": 268,
        "finit_module": 273, "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282,
    }, x32=False),
}  # fmt: skip
REFUSED = (
    "keyctl", "add_key", "request_key",
    "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
    "syslog", "acct", "swapon", "swapoff", "quotactl", "reboot", "lookup_dcookie", "iopl", "ioperm",
)  # fmt: skip
"""Calls answered EPERM (those an architecture does not have are skipped)."""


def filter_program(machine: str | None = None) -> bytes:
    """The filter as an array of ``struct sock_filter`` for ``machine`` (``platform.machine()``).

    Raises ``ValueError`` for an architecture whose system-call numbers are not known here.
    """
    name = machine or platform.machine()
    if name not in _ARCHES:
        raise ValueError(f"the sandbox's system-call filter knows {', '.join(_ARCHES)}, not {name}")
    arch = _ARCHES[name]
    refused = [arch.numbers[call] for call in REFUSED if call in arch.numbers]
    # (opcode, jump-if-true label, jump-if-false label, k); labels resolve to relative offsets
    program: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH_OFFSET),
        (_JEQ_K, "native", "kill", arch.audit_arch),
    ]
    labels = {"native": len(program)}
    program.append((_LD_W_ABS, None, None, _NR_OFFSET))
    if arch.x32:
        program.append((_JGE_K, "enosys", None, _X32_SYSCALL_BIT))
    program += [(_JEQ_K, "eperm", None, number) for number in refused]
    program += [
        (_JEQ_K, "enosys", None, arch.numbers["clone3"]),
        (_JEQ_K, "ioctl", None, arch.numbers["ioctl"]),
        (_JEQ_K, "clone", None, arch.numbers["clone"]),
        (_JEQ_K, "socket", None, arch.numbers["socket"]),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    labels["ioctl"] = len(program)
    program += [
        (_LD_W_ABS, None, None, _ARGS_OFFSET + 8 * 1),  # the request, low 32 bits
        (_JEQ_K, "eperm", None, TIOCSTI),
        (_JEQ_K, "eperm", None, TIOCLINUX),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    labels["clone"] = len(program)
    program += [
        (_LD_W_ABS, None, None, _ARGS_OFFSET),  # the flags, low 32 bits (all the namespace flags)
        (_JSET_K, "eperm", None, _CLONE_NAMESPACE_FLAGS),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    labels["socket"] = len(program)
    program.append((_LD_W_ABS, None, None, _ARGS_OFFSET))  # the family
    program += [(_JEQ_K, "allow", None, family) for family in SOCKET_FAMILIES]
    program.append((_RET_K, None, None, _RET_ERRNO | errno.EAFNOSUPPORT))
    labels["allow"] = len(program)
    program.append((_RET_K, None, None, _RET_ALLOW))
    for label, value in (("eperm", _RET_ERRNO | errno.EPERM), ("enosys", _RET_ERRNO | errno.ENOSYS), ("kill", _RET_KILL_PROCESS)):
        labels[label] = len(program)
        program.append((_RET_K, None, None, value))
    encoded = bytearray()
    for index, (code, if_true, if_false, k) in enumerate(program):
        jt = labels[if_true] - index - 1 if if_true else 0
        jf = labels[if_false] - index - 1 if if_false else 0
        assert 0 <= jt < 256 and 0 <= jf < 256, "a jump too far for classic BPF"
        encoded += struct.pack("<HBBI", code, jt, jf, k)
    return bytes(encoded)


def syscall_number(name: str, machine: str | None = None) -> int:
    """The number of a call named in this module's tables, on ``machine`` (this one by default)."""
    return _ARCHES[machine or platform.machine()].numbers[name]
