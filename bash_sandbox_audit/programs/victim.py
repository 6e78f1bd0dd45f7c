"""A victim process outside the sandbox that reports, from outside, what was done to it.

Started by the audit as ``python -c TEXT STATUS_PATH AUDIT_PID HELD_PATH``: it logs every
signal it receives, being traced, and a change of its memory canary to STATUS_PATH, holds
HELD_PATH open (a descriptor to steal), and dies with the audit (PDEATHSIG).
"""

import ctypes
import os
import signal
import sys
import time
from types import FrameType

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[2]):
    sys.exit(0)  # the audit died before PDEATHSIG was armed
status_path, held_path = sys.argv[1], sys.argv[3]
canary = ctypes.create_string_buffer(os.environ["VICTIM_MEMORY"].encode(), 64)
original = canary.raw
held = os.open(held_path, os.O_RDONLY)


def log(line: str) -> None:
    with open(status_path, "a") as fh:
        fh.write(line + "\n")


def on_signal(signum: int, frame: FrameType | None) -> None:
    log(f"SIGNAL {signum}")


for s in (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGALRM,
    signal.SIGQUIT,
):
    signal.signal(s, on_signal)
log(f"READY {os.getpid()} {ctypes.addressof(canary)} {len(original)} {held}")
while True:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("TracerPid:") and line.split()[1] != "0":
                log("TRACED " + line.split()[1])
    if canary.raw != original:
        log("MEMORY-CHANGED")
        original = canary.raw
    time.sleep(0.01)
