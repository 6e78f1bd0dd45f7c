"""Run (or start + read) one command and report this process's own peak RSS and the spill.

Measured in a child process so concurrent attacks do not blur the peak. Run as
``python -c TEXT CONFIG_JSON``; prints one JSON line.
"""

import asyncio
import hashlib
import json
import os
import sys
from typing import Any

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest


def kib(name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def spill_facts(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    st = os.stat(path)
    parent = os.stat(os.path.dirname(path))
    return {
        "path": path,
        "size": size,
        "sha256": h.hexdigest(),
        "mode": st.st_mode & 0o777,
        "dir_mode": parent.st_mode & 0o777,
    }


def reset_peak() -> bool:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


cfg = json.loads(sys.argv[1])


async def main() -> None:
    ex = SandboxBashExecutor(**cfg["executor"])
    request = BashExecRequest(command=cfg["command"], env=cfg["env"], timeout_ms=cfg["timeout_ms"])
    out: dict[str, Any] = {"reset": reset_peak(), "rss_before": kib("VmRSS")}
    if cfg["background"]:
        proc = await ex.start(ex.resolve(request))
        await proc.wait()
        out["hwm_collect"] = kib("VmHWM")
        reset_peak()
        out["rss_before_read"] = kib("VmRSS")
        read = proc.read_output()
        out["read_chars"] = len(read.delta)
        del read
        out["hwm_after"] = kib("VmHWM")
        out["status"] = proc.status
        await ex.aclose()
    else:
        r = await ex.run(ex.resolve(request))
        out["hwm_after"] = kib("VmHWM")
        out.update(
            exit_code=r.exit_code,
            signal=r.signal,
            timed_out=r.timed_out,
            stdout_chars=len(r.stdout.text),
            stdout_truncated=r.stdout.truncated,
            stderr_chars=len(r.stderr.text),
            stderr_truncated=r.stderr.truncated,
            stdout_tail=r.stdout.text[-200:],
            stderr_tail=r.stderr.text[-200:],
            stdout_spill=spill_facts(r.stdout.spill_path),
            stderr_spill=spill_facts(r.stderr.spill_path),
            spill_dir=ex.spill_directory,
        )
        await ex.aclose()
        for p in (r.stdout.spill_path, r.stderr.spill_path):
            if p:
                os.unlink(p)  # the audit keeps disk use bounded too
    print(json.dumps(out), flush=True)


asyncio.run(main())
