"""Row 7: ptrace, process_vm_*, /proc/<pid>/mem and environ of a host process."""

from __future__ import annotations

import os

from bash_sandbox_audit.attacks.common import (
    victim_attack,
)
from bash_sandbox_audit.checks import (
    no_escape_lines,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from bash_sandbox_audit.targets import Victim

_PTRACE = """
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
pid = {{vpid}}
"""

ATTACKS: list[Attack] = [
    victim_attack(
        "row7-ptrace-attach",
        7,
        "PTRACE_ATTACH a host process",
        _PTRACE
        + """
def attach():
    if libc.ptrace(16, pid, None, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    os.waitpid(pid, 0x40000000)
    libc.ptrace(17, pid, None, None)
    return "attached and detached"
attempt("PTRACE_ATTACH", attach)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-ptrace-seize",
        7,
        "PTRACE_SEIZE a host process",
        _PTRACE
        + """
def seize():
    if libc.ptrace(0x4206, pid, None, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    time.sleep(0.3)
    return "seized"
attempt("PTRACE_SEIZE", seize)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-gdb-attach",
        7,
        "gdb -p a host process",
        "timeout 10 gdb -p {{vpid}} -batch -nx -ex 'info registers pc' 2>&1 | "
        "grep -E '^(pc|rip) ' && echo 'ESCAPE gdb read the victim registers'",
        no_escape_lines,
        needs="gdb",
    ),
    victim_attack(
        "row7-strace-attach",
        7,
        "strace -p a host process",
        "timeout 1 strace -p {{vpid}} -o /dev/null 2>&1 | grep -i 'attached' && "
        "echo 'ESCAPE strace attached'",
        no_escape_lines,
        needs="strace",
    ),
    victim_attack(
        "row7-process-vm-writev",
        7,
        "process_vm_writev into a host process",
        """
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
data = ctypes.create_string_buffer(b"PWNED-BY-THE-AUDIT", 18)
local = IOV(ctypes.cast(data, ctypes.c_void_p), 18)
remote = IOV(ctypes.c_void_p({{vaddr}}), 18)
attempt("process_vm_writev", lambda: sys_call("process_vm_writev", {{vpid}}, ctypes.byref(local),
                                              1, ctypes.byref(remote), 1, 0))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-process-vm-readv",
        7,
        "process_vm_readv from a host process",
        """
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
data = ctypes.create_string_buffer(64)
local = IOV(ctypes.cast(data, ctypes.c_void_p), 64)
remote = IOV(ctypes.c_void_p({{vaddr}}), 64)
if attempt("process_vm_readv", lambda: sys_call("process_vm_readv", {{vpid}},
           ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)):
    print(data.raw.decode(errors="replace"))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-mem-write",
        7,
        "write /proc/<pid>/mem of a host process",
        """
def poke():
    with open("/proc/{{vpid}}/mem", "r+b", buffering=0) as fh:
        fh.seek({{vaddr}})
        return fh.write(b"PWNED-BY-THE-AUDIT")
attempt("write /proc/pid/mem", poke)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-mem-read",
        7,
        "read /proc/<pid>/mem of a host process",
        """
def peek():
    with open("/proc/{{vpid}}/mem", "rb", buffering=0) as fh:
        fh.seek({{vaddr}})
        return fh.read(64).decode(errors="replace")
print(attempt("read /proc/pid/mem", peek))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-pidfd-getfd",
        7,
        "steal a descriptor of a host process (pidfd_getfd)",
        """
def steal():
    pfd = sys_call("pidfd_open", {{vpid}}, 0)
    return sys_call("pidfd_getfd", pfd, {{vfd}}, 0)
attempt("pidfd_getfd", steal)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-environ",
        7,
        "read /proc/<pid>/environ of a host process",
        "tr '\\0' '\\n' < /proc/{{vpid}}/environ",
        no_escape_lines,
    ),
]


def victim_invisible(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """The victim's command line carries its unique status path: listing it shows it."""
    victim: Victim = setup.data["victim"]
    if os.path.basename(victim.status_path) in outcome.all_output():
        return [f"the host process {victim.pid} (the audit's victim) is listed inside"]
    return []


ATTACKS += [
    victim_attack(
        "row7-list-host-processes",
        7,
        "list processes (ps -e, /proc/*/cmdline): only the command's own may show",
        "ps -eo pid,args 2>&1; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; "
        "echo; done 2>/dev/null",
        victim_invisible,
    ),
]
