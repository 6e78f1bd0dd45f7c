"""Row 12: exhaust the executor with output (measured in a child process)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from bash_sandbox_audit import drives
from bash_sandbox_audit.checks import (
    shorten,
)
from bash_sandbox_audit.layout import (
    build_layout,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    Verify,
    audit_error,
    contained,
    escaped,
)

# -- row 12: exhausting the executor -------------------------------------------------------------

MEMORY_LIMIT_KIB = 32 * 1024  # growth allowed over the run, far above the 64 kB output cap
OUTPUT_CAP = 64_000


def _seq_digest(n: int) -> str:
    return hashlib.sha256("".join(f"{i}\n" for i in range(1, n + 1)).encode()).hexdigest()


def _file_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _verify_flood(
    stream: str,
    size: int,
    digest: Callable[[AttackEnv], str | None] | None,
    *,
    over_spill_cap: bool = False,
    background: bool = False,
) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        m: dict[str, Any] | None = outcome.notes.get("measured")
        if m is None:
            return audit_error(
                "the measured run did not report",
                [shorten(env, str(outcome.notes.get("helper_stderr", ""))[-400:])],
            )
        evidence: list[str] = []
        base = m["rss_before_read"] if background else m["rss_before"]
        growth = m["hwm_after"] - base
        if growth > MEMORY_LIMIT_KIB:
            what = "reading the output" if background else "the run"
            evidence.append(
                f"executor memory grew by {growth // 1024} MiB during {what} "
                f"(limit {MEMORY_LIMIT_KIB // 1024} MiB)"
            )
        if background:
            return (
                escaped(evidence[0], evidence)
                if evidence
                else contained(f"read of {m['read_chars']} chars stayed under the limit")
            )
        chars = m[f"{stream}_chars"]
        if chars > OUTPUT_CAP:
            evidence.append(f"result text holds {chars} chars (cap {OUTPUT_CAP})")
        spill = m[f"{stream}_spill"]
        if over_spill_cap:
            leftovers = _files_in(m.get("spill_dir"))
            if spill is not None:
                evidence.append("a spill path was reported for a stream beyond the spill cap")
            if leftovers:
                evidence.append(f"partial spill files left behind: {leftovers[:3]}")
        elif spill is None:
            evidence.append(f"no spill file for a truncated {stream} of {size} bytes")
        else:
            if spill["size"] != size:
                evidence.append(f"spill holds {spill['size']} of {size} bytes")
            want = digest(env) if digest else None
            if want is not None and spill["sha256"] != want:
                evidence.append("spill content differs from what the command wrote")
            if spill["mode"] != 0o600 or spill["dir_mode"] != 0o300:
                evidence.append(
                    f"spill modes {spill['mode']:o}/{spill['dir_mode']:o} "
                    "(want 600/300: never listable)"
                )
        if evidence:
            return escaped(evidence[0], evidence)
        return contained(
            f"peak +{max(growth, 0) // 1024} MiB, text {chars} chars"
            + ("" if over_spill_cap else f", spill {size} bytes intact")
        )

    return verify


def _files_in(path: str | None) -> list[str]:
    if not path or not os.path.isdir(path):
        return []
    return sorted(os.listdir(path))


def flood_attack(
    id: str,
    title: str,
    command: str,
    *,
    stream: str = "stdout",
    size: int,
    digest: Callable[[AttackEnv], str | None] | None = None,
    spill_cap: int = 256 * 1024 * 1024,
    over_spill_cap: bool = False,
    background: bool = False,
    premise: Callable[[AttackEnv], None] | None = None,
) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        build_layout(env)
        if premise is not None:
            premise(env)
        return AttackSetup(
            command=env.render(command),
            timeout_ms=60_000,
            executor_kwargs={"max_spill_bytes": spill_cap},
            data={"background": background},
        )

    return Attack(
        id,
        12,
        title,
        prepare,
        _verify_flood(stream, size, digest, over_spill_cap=over_spill_cap, background=background),
        drives.measured,
        budget_s=90,
    )


def _write_blob(env: AttackEnv) -> None:
    with open(os.path.join(env.host, "blob.bin"), "wb") as fh:
        fh.write(os.urandom(20 * 1024 * 1024))


MB200 = 200 * 1024 * 1024
ATTACKS: list[Attack] = [
    flood_attack(
        "row12-200mb-stdout", "200 MB on stdout", f"head -c {MB200} /dev/zero", size=MB200
    ),
    flood_attack(
        "row12-million-lines",
        "a million lines",
        "seq 1 1000000",
        size=6888896,
        digest=lambda env: _seq_digest(1_000_000),
    ),
    flood_attack(
        "row12-binary",
        "20 MB of random binary output",
        "cat {{host}}/blob.bin",
        size=20 * 1024 * 1024,
        digest=lambda env: _file_digest(os.path.join(env.host, "blob.bin")),
        premise=_write_blob,
    ),
    flood_attack(
        "row12-stderr-flood",
        "100 MB on stderr",
        f"head -c {100 * 1024 * 1024} /dev/zero >&2",
        stream="stderr",
        size=100 * 1024 * 1024,
    ),
    flood_attack(
        "row12-one-huge-line",
        "one 50 MB line without a newline",
        "head -c 52428800 /dev/zero | tr '\\0' a",
        size=52428800,
    ),
    flood_attack(
        "row12-beyond-spill-cap",
        "output beyond the spill cap (disk stays bounded)",
        f"head -c {32 * 1024 * 1024} /dev/zero",
        size=32 * 1024 * 1024,
        spill_cap=8 * 1024 * 1024,
        over_spill_cap=True,
    ),
    flood_attack(
        "row12-background-read",
        "100 MB from a background process, then read_output()",
        f"head -c {100 * 1024 * 1024} /dev/zero",
        size=100 * 1024 * 1024,
        background=True,
    ),
]
