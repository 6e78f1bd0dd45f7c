"""Row 14: a missing, broken, hanging, tampered or planted runner or helper binary."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox_audit import drives, scenarios
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    Render,
    judged_by,
    scenario,
)
from bash_sandbox_audit.checks import (
    guards_unchanged,
    shorten,
    verify_control,
)
from bash_sandbox_audit.model import (
    READ_ONLY,
    Attack,
    AttackEnv,
    AttackSetup,
    Drive,
    Finding,
    Outcome,
    Verify,
    audit_error,
    contained,
    escaped,
)
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import (
    pid_alive,
)

# -- row 14: runners -------------------------------------------------------------------------

RUNNER_COMMAND = BEGIN + "echo ran > {{ws}}/marker-{{token}}\n"
TAMPERED = program_text("tampered_runner.sh")


def _script(env: AttackEnv, name: str, body: str) -> str:
    os.makedirs(env.path("runner"), exist_ok=True)
    path = env.path("runner", name)
    with open(path, "w") as fh:
        fh.write(body)
    os.chmod(path, 0o755)  # noqa: S103 - a runner script must be executable
    return path


def _after_probe(env: AttackEnv, then: str) -> str:
    from bash_sandbox.backends.bwrap import find_bwrap

    bwrap = find_bwrap() or "/usr/bin/bwrap"
    calls = env.path("runner", "calls")
    return f'#!/bin/sh\nif [ ! -e {calls} ]; then : > {calls}; exec {bwrap} "$@"; fi\n' + then


def _runner_data(env: AttackEnv, kind: str) -> dict[str, Any]:
    """The runner argv (and, for a tampered runner under root, the copy-on-write view)."""
    data: dict[str, Any] = {"markers": [env.path("ws", f"marker-{env.token}")]}
    if kind == "missing":
        data["runner"] = [env.path("runner", "does-not-exist")]
    elif kind == "broken":
        data["runner"] = [
            _script(env, "broken", "#!/bin/sh\necho 'bwrap: setup failed' >&2\nexit 1\n")
        ]
    elif kind == "hanging":
        pidfile = env.path("runner", "pid")
        data["runner"] = [
            _script(env, "hanging", f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
        ]
        data["pidfile"] = pidfile
        env.cleanup.add(lambda: drives.kill_pid_file(pidfile))
    elif kind in ("tampered", "tampered-unprivileged"):
        data["runner"] = [_script(env, "tampered", TAMPERED)]
    elif kind in ("fails-after-probe", "fails-after-probe-background"):
        data["runner"] = [
            _script(env, "flaky", _after_probe(env, "echo 'bwrap: setup failed' >&2\nexit 1\n"))
        ]
    elif kind == "tampered-after-probe":
        data["runner"] = [_script(env, "sleeper", _after_probe(env, TAMPERED.split("\n", 1)[1]))]
    return data


def _overlay_config(env: AttackEnv, unprivileged: bool) -> dict[str, Any] | str:
    """Dirs for the copy-on-write view; what an ordinary user must be able to reach."""
    cfg: dict[str, Any] = {"overlay": os.geteuid() == 0}
    if not cfg["overlay"]:
        return cfg
    for d in ("upper", "work", "merged"):
        os.makedirs(env.path("ov", d), exist_ok=True)
        cfg[d] = env.path("ov", d)
    if unprivileged:
        tmpdir = env.path("nobody-tmp")
        os.makedirs(tmpdir, exist_ok=True)
        import bash_sandbox

        reach = [
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            os.path.dirname(os.path.dirname(bash_sandbox.__file__)),
            env.ws,
            tmpdir,
            env.path("runner"),
        ]
        open_up: set[str] = set()
        root_dev = os.stat("/").st_dev
        for path in reach:
            cur = os.path.realpath(path)
            while True:
                st = os.stat(cur)
                if st.st_dev != root_dev:
                    return "a path an ordinary user needs is not on the root filesystem"
                if st.st_mode & 0o005 != 0o005 or cur in (env.ws, tmpdir):
                    open_up.add(cur)
                if cur == "/":
                    break
                cur = os.path.dirname(cur)
        cfg.update(uid=65534, tmpdir=tmpdir, open_up=sorted(open_up), writable=[env.ws, tmpdir])
    return cfg


def _existing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def _verify_runner(*, expect_error: bool) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        helper = outcome.notes.get("helper")
        # Only a root audit runs the runner in a helper (inside a copy-on-write view).
        if setup.data.get("overlay_config", {}).get("overlay") and helper is None:
            return audit_error(
                "the runner helper did not report",
                [
                    shorten(
                        env,
                        str(
                            outcome.notes.get("helper_stderr", "")
                            or outcome.notes.get("helper_output", "")
                        )[-400:],
                    )
                ],
            )
        markers = list(setup.data["markers"])
        upper = setup.data.get("overlay_config", {}).get("upper")
        if upper:
            markers += [upper + m for m in setup.data["markers"]]
        ran = _existing(markers)
        if ran:
            return escaped(
                "the command ran unconfined through the runner",
                [shorten(env, f"marker written: {m}") for m in ran],
            )
        raised = ""
        if isinstance(outcome.error, SandboxUnavailableError):
            raised = outcome.error.detail
        elif outcome.error is not None:
            return audit_error(f"unexpected {type(outcome.error).__name__}: {outcome.error}")
        elif helper is not None and str(helper.get("raised", "")).startswith("SandboxUnavail"):
            raised = str(helper["raised"]).split(": ", 1)[-1]
        elif helper is not None and helper.get("raised"):
            return audit_error(f"unexpected error in the helper: {helper['raised']}")
        pid = drives.pid_from_file(setup.data.get("pidfile", ""))
        note = ""
        if pid is not None and pid_alive(pid):
            note = f" (the hanging runner, pid {pid}, was still alive and is killed by the audit)"
        if expect_error and not raised:
            facts = outcome.result.sandbox if outcome.result is not None else None
            return escaped(
                "no SandboxUnavailableError: the caller was told the command ran",
                [f"facts: {facts}"],
            )
        if not expect_error:
            facts = outcome.notes.get("facts")
            if facts is None or not facts.runner_failed:
                return escaped(
                    "the background result does not report runner_failed", [f"facts: {facts}"]
                )
            return contained("runner_failed reported; the command never ran")
        uid = f" [executor uid {helper['uid']}]" if helper and "uid" in helper else ""
        return contained(shorten(env, raised)[:110] + uid + note)

    return verify


def runner_attack(kind: str, title: str, *, probe_ms: int = 5_000) -> Attack:
    overlay = kind in ("tampered", "tampered-unprivileged")

    async def prepare(env: AttackEnv) -> AttackSetup:
        os.makedirs(env.ws, exist_ok=True)
        data = _runner_data(env, kind)
        if overlay:
            cfg = _overlay_config(env, kind == "tampered-unprivileged")
            if isinstance(cfg, str):
                return AttackSetup(skip=cfg)
            if kind == "tampered-unprivileged" and not cfg["overlay"]:
                return AttackSetup(skip="already unprivileged: row14-tampered-runner covers it")
            data["overlay_config"] = cfg
        return AttackSetup(
            command=env.render(RUNNER_COMMAND),
            data=data,
            executor_kwargs={"runner_command": data["runner"], "probe_timeout_ms": probe_ms},
        )

    drive: Drive = drives.foreground
    if overlay:
        drive = drives.overlay_runner
    elif kind == "fails-after-probe-background":
        drive = drives.background_wait

    async def chosen(env: AttackEnv, setup: AttackSetup) -> Outcome:
        if overlay and not setup.data["overlay_config"]["overlay"]:
            return await drives.foreground(env, setup)
        return await drive(env, setup)

    return Attack(
        f"row14-{kind}-runner",
        14,
        title,
        prepare,
        _verify_runner(expect_error=kind != "fails-after-probe-background"),
        chosen,
        backends=frozenset({"bwrap"}),
    )


ATTACKS: list[Attack] = [
    runner_attack("missing", "a runner that does not exist"),
    runner_attack("broken", "a runner that fails at once (`bwrap: setup failed`, exit 1)"),
    runner_attack("hanging", "a runner that hangs (probe timeout)", probe_ms=500),
    runner_attack("tampered", "a runner that drops every option and runs the command unconfined"),
    runner_attack(
        "tampered-unprivileged",
        "the same tampered runner, with the executor running as an ordinary user",
    ),
    runner_attack("fails-after-probe", "a runner that passes the probe, then fails"),
    runner_attack(
        "fails-after-probe-background",
        "a runner that passes the probe, then fails a background start()",
    ),
    runner_attack(
        "tampered-after-probe", "a runner that passes the probe, then runs commands unconfined"
    ),
]


# -- helper binaries planted in a workspace venv on PATH ---------------------------------------

PLANTED_HELPERS = ("nsenter", "unshare", "bwrap", "mount")


def _planted_venv(env: AttackEnv) -> dict[str, Any]:
    """An activated venv inside the workspace whose bin/ shadows the helpers the backends
    run on the host; each records that it ran (outside the workspace), then runs the real one.

    The bwrap column uses ``backend="auto"``, so a silent fall-back to Landlock would show."""
    venv = os.path.join(env.ws, ".venv")
    bin_dir = os.path.join(venv, "bin")
    os.makedirs(bin_dir)
    planted = []
    for name in PLANTED_HELPERS:
        real = shutil.which(name) or f"/usr/bin/{name}"
        marker = os.path.join(env.host, f"planted-{name}-ran-{env.token}")
        planted.append(marker)
        path = os.path.join(bin_dir, name)
        with open(path, "w") as fh:
            fh.write(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexec {real} "$@"\n')
        os.chmod(path, 0o755)  # noqa: S103 - a planted helper must be executable
    return {
        "process_env": {
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            "VIRTUAL_ENV": venv,
        },
        "executor_kwargs": {"backend": "auto" if env.backend == "bwrap" else env.backend},
        "planted": planted,
    }


def _helper_commands(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {"commands": [render(BEGIN + "echo FIRST-RAN"), render(BEGIN + "echo SECOND-RAN")]}


def _degraded(env: AttackEnv, outcome: Outcome) -> list[str]:
    """Results that do not say the column's backend with full enforcement."""
    found = []
    for result in outcome.results:
        facts = result.sandbox
        if facts is None or facts.backend != env.backend or facts.enforcement != "full":
            found.append(
                f"a result says backend={facts.backend if facts else None}, "
                f"enforcement={facts.enforcement if facts else None} (want {env.backend}, full)"
            )
    return found


def _planted_finding(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    ran = [m for m in setup.data["planted"] if os.path.exists(m)]
    evidence = [shorten(env, f"a planted helper ran on the host: {m}") for m in ran]
    evidence += guards_unchanged(env, setup, outcome) if not ran else []
    raised: list[str] = outcome.notes.get("raised", [])
    if not raised and len(outcome.results) < 2:
        return audit_error("the executor's helper process did not report", evidence)
    evidence += _degraded(env, outcome)
    if evidence:
        return escaped(evidence[0], evidence)
    if raised:
        return contained(shorten(env, "refused: " + raised[0])[:110])
    return contained(f"no planted helper ran; both results say {env.backend}, full")


def _control_planted(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    raised: list[str] = outcome.notes.get("raised", [])
    return [f"the executor raised: {r}" for r in raised] + _degraded(env, outcome)


ATTACKS += [
    scenario(
        "row14-planted-helpers-on-path",
        14,
        "nsenter, unshare, bwrap, mount planted in an activated workspace venv on PATH",
        _helper_commands,
        extra=_planted_venv,
        drive=scenarios.in_own_process,
        verify=judged_by(_planted_finding),
    ),
]

CONTROLS: list[Attack] = [
    scenario(
        "row14-control-workspace-venv-on-path",
        14,
        "commands still run, on the expected backend with full enforcement, while a "
        "workspace venv is on PATH",
        _helper_commands,
        extra=_planted_venv,
        drive=scenarios.in_own_process,
        verify=verify_control("FIRST-RAN", "SECOND-RAN", checks=[_control_planted]),
        kind="control",
        # The process environment does not depend on the mode: one mode keeps it fast.
        modes=READ_ONLY,
    ),
]
