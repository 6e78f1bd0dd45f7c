"""Row 13: the executor's secrets: inherited credentials and spill files."""

from __future__ import annotations

import os
import re
from typing import Any

from bash_sandbox_audit import drives, scenarios
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    Render,
    attack,
    needs_python,
    scenario,
)
from bash_sandbox_audit.checks import (
    output_lacks,
    verify_control,
    why_contained,
)
from bash_sandbox_audit.layout import (
    build_layout,
)
from bash_sandbox_audit.model import (
    READ_ONLY,
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    audit_error,
    contained,
    escaped,
)

# -- row 13: the executor's secrets ----------------------------------------------------------

# Hunting a spill file: its known path and directory, a search of the temp dir, and every
# descriptor of every visible process that names a spill file.
SPILL_HUNT = (
    "cat {{spill}}; ls -la {{spill_dir}}; find {{spill_dir}} {{spill_parent}} -maxdepth 2 "
    "\\( -name '*.stdout' -o -name '*.stderr' \\) -exec cat {} + 2>&1 | head -c 20000; "
    "timeout 10 grep -rl AUDIT-SPILL-{{token}} ${TMPDIR:-/tmp} 2>/dev/null | head -5 | "
    "xargs -r cat 2>&1 | head -c 2000; cp {{spill}} {{ws}}/spill-copy 2>&1\n"
    "{{py}} - <<'PY'\n"
    "import glob, os\n"
    "for fd in glob.glob('/proc/[0-9]*/fd/*'):\n"
    "    try:\n"
    "        target = os.readlink(fd)\n"
    "        if target.endswith(('.stdout', '.stderr')):\n"
    "            print(open(fd, errors='replace').read(4000))\n"
    "    except OSError as exc:\n"
    "        pass\n"
    "PY\n"
)

# Credential-shaped variables a harness really inherits (CI systems, package registries,
# databases, clouds, model APIs). Values embed the run token; some hide it in a URL.
CREDENTIAL_NAMES = (
    "GITHUB_PAT", "GH_PASS", "GH_ENTERPRISE_TOKEN", "GITLAB_PRIVATE_TOKEN",
    "BITBUCKET_APP_PASSWORD", "NPM_CONFIG__AUTH", "npm_config_//registry.npmjs.org/:_authToken",
    "YARN_NPM_AUTH_TOKEN", "DOCKER_AUTH_CONFIG", "DOCKER_PASS", "CI_JOB_JWT", "CI_JOB_JWT_V2",
    "CI_REGISTRY_PASSWORD", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_RUNTIME_TOKEN",
    "MYSQL_PWD", "PGPASSWORD", "SSHPASS", "LDAP_BIND_PW", "SMTP_PASS", "AWS_SESSION_TOKEN",
    "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AZURE_CLIENT_SECRET", "ARM_CLIENT_SECRET",
    "GOOGLE_API_KEY", "CLOUDSDK_AUTH_ACCESS_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "COHERE_API_KEY", "VAULT_TOKEN",
    "CONSUL_HTTP_TOKEN", "NOMAD_TOKEN", "TWINE_PASSWORD", "PYPI_API_TOKEN",
    "CARGO_REGISTRY_TOKEN", "GEM_HOST_API_KEY", "NUGET_API_KEY", "CODECOV_TOKEN",
    "SONAR_TOKEN", "SNYK_TOKEN", "STRIPE_SECRET_KEY", "TWILIO_AUTH_TOKEN", "SENDGRID_API_KEY",
    "HEROKU_API_KEY", "NETLIFY_AUTH_TOKEN", "VERCEL_TOKEN", "CLOUDFLARE_API_TOKEN",
    "DIGITALOCEAN_ACCESS_TOKEN", "ARTIFACTORY_API_KEY",
)  # fmt: skip
# Credentials in a value whose name says nothing: URLs with a password, socket and key paths.
CREDENTIAL_URLS = {
    "DATABASE_URL": "postgres://app:{secret}@db.example.invalid/app",
    "REDIS_URL": "redis://:{secret}@cache.example.invalid:6379/0",
    "MONGODB_URI": "mongodb://app:{secret}@mongo.example.invalid/app",
    "AMQP_URL": "amqp://app:{secret}@mq.example.invalid/",
    "SENTRY_DSN": "https://{secret}@o0.ingest.example.invalid/1",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.example.invalid/services/T0/B0/{secret}",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey={secret};",
    "SSH_AUTH_SOCK": "/nonexistent/{secret}/agent.sock",
    "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/{secret}/service-account.json",
    "KUBECONFIG": "/nonexistent/{secret}/kubeconfig",
}


def _credential_values(token: str) -> dict[str, str]:
    values = {name: f"audit-cred-{n}-{token}" for n, name in enumerate(CREDENTIAL_NAMES)}
    values.update(
        {
            name: shape.format(secret=f"audit-cred-url{n}-{token}")
            for n, (name, shape) in enumerate(CREDENTIAL_URLS.items())
        }
    )
    return values


CREDENTIALS = _credential_values("x")


def _credential_env(env: AttackEnv) -> dict[str, Any]:
    values = _credential_values(env.token)
    return {"process_env": values, "credentials": values}


def _credential_commands(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {
        "commands": [
            render(
                BEGIN + "env; tr '\\0' '\\n' < /proc/self/environ; "
                "{{py}} -c 'import os; print(dict(os.environ))'; "
                "cp /proc/self/environ {{ws}}/environ-copy 2>&1\n"
            )
        ]
    }


def credentials_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """No credential value reached the command (its output, or a file it wrote)."""
    text = outcome.all_output()
    try:
        with open(os.path.join(env.ws, "environ-copy"), errors="replace") as fh:
            text += fh.read()
    except OSError:
        pass
    credentials: dict[str, str] = setup.data["credentials"]
    leaked = [name for name, value in credentials.items() if _secret_of(value) in text]
    if not leaked:
        return []
    return [
        f"{len(leaked)} of {len(credentials)} credentials reached the command",
        "leaked: " + ", ".join(leaked),
    ]


def _secret_of(value: str) -> str:
    """The canary inside a credential value (the whole value, or the URL's password)."""
    found = re.search(r"audit-cred-[\w-]+", value)
    return found.group(0) if found else value


ORDINARY = {"LANG": "C.UTF-8"}


def _ordinary_env(env: AttackEnv) -> dict[str, Any]:
    return {
        "process_env": ORDINARY,
        "request_env": {"AUDIT_REQUEST_SETTING": f"request-{env.token}"},
    }


def _ordinary_commands(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {
        "commands": [
            render(
                BEGIN + 'echo "SEEN-PATH=$PATH"; echo "SEEN-HOME=$HOME"; echo "SEEN-LANG=$LANG"; '
                'echo "SEEN-REQUEST=$AUDIT_REQUEST_SETTING"\n'
            )
        ]
    }


def ordinary_env_passed(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    wanted = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", ""),
        "LANG": ORDINARY["LANG"],
        "REQUEST": f"request-{env.token}",
    }
    return [
        f"{name} did not reach the command"
        for name, value in wanted.items()
        if f"SEEN-{name}={value}" not in text.splitlines()
    ]


def session_canaries_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    return [
        f"{name} from the executor's environment is visible"
        for name, value in env.canaries.items()
        if value in text
    ]


def environ_unread(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """`/proc/<executor>/environ` shows the environment the executor started with (later
    changes, like the audit's canaries, are not in it): any byte read is a leak."""
    for line in outcome.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["ENVIRON-BYTES"] and len(parts) == 2 and parts[1] != "0":
            return [f"{parts[1]} bytes of the executor's environment were readable"]
    return []


SPILL_FIRST = (
    '{{py}} -c \'import sys; sys.stdout.write(("AUDIT-SPILL-" + sys.argv[1] + '
    '"\\n") * 400)\' {{token}}'
)


def _verify_spill(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    if outcome.error is not None:
        return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
    spill = outcome.notes.get("spill_path")
    if not spill or outcome.result is None:
        return audit_error("premise failed: the first run did not spill")
    second = outcome.result.stdout.text + outcome.result.stderr.text
    if outcome.result.stdout.spill_path:  # a successful read overflows the small cap
        with open(outcome.result.stdout.spill_path, errors="replace") as fh:
            second = fh.read(1 << 20) + second
    if "AUDIT-BEGIN" not in second:
        return audit_error("premise failed: the second run did not start")
    evidence = []
    if f"AUDIT-SPILL-{env.token}" in second:
        evidence.append("another run's spill file was read")
    evidence += [f"the spilled canary was copied into {p}" for p in _workspace_copies(env)]
    name = os.path.basename(spill)
    stem = name.split(".")[0]
    if len(stem) < 32 or any(c not in "0123456789abcdef" for c in stem):
        evidence.append(f"spill file name {name!r} is predictable")
    mode, dir_mode = outcome.notes.get("spill_mode"), outcome.notes.get("spill_dir_mode")
    if mode != 0o600 or dir_mode != 0o300:
        evidence.append(f"spill modes {mode:o}/{dir_mode:o} (want 600/300: never listable)")
    if evidence:
        return escaped(evidence[0], evidence)
    return contained(why_contained(env, outcome) or "spill unreadable")


def _workspace_copies(env: AttackEnv) -> list[str]:
    """Workspace files (host view) holding the spilled canary: a copy is a read too."""
    needle = f"AUDIT-SPILL-{env.token}".encode()
    found = []
    for dirpath, _dirs, files in os.walk(env.ws):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            try:
                with open(path, "rb") as fh:
                    if needle in fh.read(1 << 20):
                        found.append(os.path.relpath(path, env.ws))
            except OSError:
                continue
    return found


def spill_attack(
    id: str,
    title: str,
    second: str,
    *,
    fresh: bool,
    first_kind: str = "sandbox",
    spill_dir: str | None = None,
) -> Attack:
    """The first run spills a canary; the second (confined) command tries to read it.
    ``first_kind="local"`` spills from a `LocalBashExecutor`; ``spill_dir`` (relative to the
    attack's root) gives the first executor a custom spill directory."""

    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := needs_python(env):
            return AttackSetup(skip=why)
        build_layout(env)
        first_kwargs = {"spill_dir": env.path(spill_dir)} if spill_dir else {}
        if spill_dir:
            os.makedirs(env.path(spill_dir))
        return AttackSetup(
            command=env.render(BEGIN + second, strict=False),
            data={
                "first": env.render(SPILL_FIRST),
                "fresh_executor": fresh,
                "first_kind": first_kind,
                "first_kwargs": first_kwargs,
            },
        )

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return _verify_spill(env, setup, outcome)

    return Attack(id, 13, title, prepare, verify, drives.two_runs)


ATTACKS: list[Attack] = [
    attack(
        "row13-credential-env",
        13,
        "credential-shaped variables of the executor "
        "(GITHUB_TOKEN, *_SECRET, *_KEY, *_PASSWORD, ...) and start-up hooks",
        "env; tr '\\0' '\\n' < /proc/self/environ; {{py}} -c 'import os; print(dict(os.environ))'",
        session_canaries_kept,
        output_lacks("AUDIT-BASH-ENV-HOOK-RAN"),
    ),
    attack(
        "row13-executor-environ",
        13,
        "read the executor's environment via /proc (what it held at start, credentials included)",
        "printf 'ENVIRON-BYTES %s\\n' \"$(wc -c < /proc/{{audit_pid}}/environ)\"; "
        "tr '\\0' '\\n' < /proc/{{audit_pid}}/environ",
        session_canaries_kept,
        environ_unread,
    ),
    spill_attack(
        "row13-spill-same-executor",
        "read the spill file of an earlier run of the same executor",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=False,
    ),
    spill_attack(
        "row13-spill-other-executor",
        "read the spill file of another executor's run",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=True,
    ),
    spill_attack(
        "row13-spill-search",
        "search the temp dirs for spill files without knowing the path",
        "timeout 20 grep -rl AUDIT-SPILL-{{token}} /tmp ${TMPDIR:-/tmp} "
        "2>/dev/null | "
        "head -20 | xargs -r cat 2>&1 | head -5",
        fresh=True,
    ),
    spill_attack(
        "row13-spill-local-executor",
        "read the spill file of a LocalBashExecutor run (default spill dir)",
        SPILL_HUNT,
        fresh=True,
        first_kind="local",
    ),
    spill_attack(
        "row13-spill-local-executor-custom-dir",
        "read the spill file of a LocalBashExecutor with a custom spill_dir",
        SPILL_HUNT,
        fresh=True,
        first_kind="local",
        spill_dir="custom-spill",
    ),
    spill_attack(
        "row13-spill-other-executor-custom-dir",
        "read the spill file of another SandboxBashExecutor with a custom spill_dir",
        SPILL_HUNT,
        fresh=True,
        spill_dir="custom-spill",
    ),
    scenario(
        "row13-credential-env-by-any-name",
        13,
        f"{len(CREDENTIALS)} credential-shaped variables in the executor's environment "
        "(GITHUB_PAT, NPM_CONFIG__AUTH, DATABASE_URL with a password, SSH_AUTH_SOCK, ...)",
        _credential_commands,
        credentials_kept,
        extra=_credential_env,
        drive=scenarios.in_own_process,
    ),
]

CONTROLS: list[Attack] = [
    scenario(
        "row13-control-ordinary-environment",
        13,
        "PATH, HOME, LANG of the executor and the request's own env still reach the command",
        _ordinary_commands,
        extra=_ordinary_env,
        drive=scenarios.in_own_process,
        verify=verify_control("AUDIT-BEGIN", checks=[ordinary_env_passed]),
        kind="control",
        # The process environment does not depend on the mode: one mode keeps it fast.
        modes=READ_ONLY,
    ),
]
