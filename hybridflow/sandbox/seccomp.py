"""The sandbox's seccomp filter, compiled by libseccomp into the BPF program that bwrap installs.

libseccomp (Debian's ``libseccomp2``, the library behind systemd's and the container runtimes'
filters) is called through ``ctypes``: its C API is stable and this avoids a compiled Python
binding. The filter allows every system call except:

- :data:`BLOCKED_SYSCALLS`, which fail with EPERM: tracing other processes, mounting, new
  namespaces, kernel modules and keyrings, BPF, perf, io_uring, userfaultfd, clock and host settings;
- ``clone3``, which fails with ENOSYS so the C library falls back to ``clone`` (its flags cannot be
  inspected by seccomp);
- ``socket`` of any family but AF_UNIX, which fails with EACCES (the sandbox has no network
  interface besides a down loopback in any case).

System calls of a foreign architecture (the i386 or x32 ABIs on x86-64) kill the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import tempfile

from hybridflow.sandbox.limits import SandboxUnavailableError

__all__ = ["BLOCKED_SYSCALLS", "build_filter"]

BLOCKED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
    "unshare", "setns",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "open_by_handle_at", "name_to_handle_at", "personality",
)  # fmt: skip

_ACT_ALLOW = 0x7FFF0000
_CMP_NE = 1


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        raise SandboxUnavailableError(
            "libseccomp is not installed (Debian package libseccomp2); the sandbox needs it for its seccomp filter"
        )
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    ]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def build_filter() -> bytes:
    """The filter as a compiled BPF program (``struct sock_filter`` records, 8 bytes each), for ``bwrap --seccomp``.

    Raises:
        SandboxUnavailableError: libseccomp is missing or refuses a rule.
    """
    lib = _library()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise SandboxUnavailableError("libseccomp could not create a filter (seccomp_init failed)")
    try:
        rules: list[tuple[str, int, list[_ArgCmp]]] = [
            (name, _act_errno(errno.EPERM), []) for name in BLOCKED_SYSCALLS
        ]
        rules.append(("clone3", _act_errno(errno.ENOSYS), []))
        rules.append(("socket", _act_errno(errno.EACCES), [_ArgCmp(0, _CMP_NE, socket.AF_UNIX, 0)]))
        for name, action, comparisons in rules:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # not a system call of this architecture
            array = (_ArgCmp * len(comparisons))(*comparisons) if comparisons else None
            status = lib.seccomp_rule_add_array(ctx, action, number, len(comparisons), array)
            if status != 0:
                raise SandboxUnavailableError(
                    f"libseccomp refused the rule for {name}: {os.strerror(-status)}"
                )
        with tempfile.TemporaryFile() as handle:
            status = lib.seccomp_export_bpf(ctx, handle.fileno())
            if status != 0:
                raise SandboxUnavailableError(
                    f"libseccomp could not export the filter: {os.strerror(-status)}"
                )
            handle.seek(0)
            return handle.read()
    finally:
        lib.seccomp_release(ctx)
