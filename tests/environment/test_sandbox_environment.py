"""The confined environment is an allowlist: no credential reaches a command, by any name.

The end-to-end test spawns a real process with the environment the executor would build
(`sandbox_inherited_env` then `build_command_env`) and reads its `/proc/self/environ`.
"""

from __future__ import annotations

import subprocess

import pytest

from bash_local import build_command_env
from bash_local.environment import is_inherited
from bash_sandbox.environment import INHERITED_NAMES, sandbox_inherited_env

# Realistic credential-carrying variables; each value is unique so a leak is attributable.
CREDENTIALS: dict[str, str] = {
    "GITHUB_PAT": "github_pat_11AAAAAAA0fake",
    "GH_PASS": "gh-pass-fake",
    "GH_ENTERPRISE_TOKEN": "ghe-fake",
    "GITHUB_TOKEN": "ghs_fake",
    "GITLAB_PRIVATE_TOKEN": "glpat-fake",
    "CI_JOB_JWT": "eyJhbGciOiJSUzI1NiJ9.ci-job-fake",
    "CI_JOB_JWT_V2": "eyJhbGciOiJSUzI1NiJ9.ci-job-v2-fake",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "actions-id-fake",
    "ACTIONS_RUNTIME_TOKEN": "actions-runtime-fake",
    "BUILDKITE_AGENT_ACCESS_TOKEN": "bk-fake",
    "CIRCLE_TOKEN": "circle-fake",
    "NPM_CONFIG__AUTH": "bnBtOmZha2U=",
    "NPM_TOKEN": "npm_fake",
    "NODE_AUTH_TOKEN": "node-auth-fake",
    "YARN_NPM_AUTH_TOKEN": "yarn-fake",
    "DOCKER_AUTH_CONFIG": '{"auths":{"r.example":{"auth":"ZG9ja2VyLWZha2U="}}}',
    "DOCKER_PASSWORD": "docker-pw-fake",
    "REGISTRY_PASS": "registry-pass-fake",
    "MYSQL_PWD": "mysql-pwd-fake",
    "PGPASSWORD": "pg-password-fake",
    "PGPASSFILE": "/home/u/.pgpass-fake",
    "REDIS_URL": "redis://:redis-pw-fake@cache:6379/0",
    "DATABASE_URL": "postgres://app:db-pw-fake@db.internal:5432/app",
    "MONGODB_URI": "mongodb+srv://u:mongo-pw-fake@cluster0.example.net/db",
    "AMQP_URL": "amqp://guest:amqp-pw-fake@mq:5672/",
    "SSHPASS": "sshpass-fake",
    "SSH_AUTH_SOCK": "/tmp/ssh-fake/agent.123",
    "GPG_AGENT_INFO": "/run/user/1000/gnupg/S.gpg-agent-fake:0:1",
    "KRB5CCNAME": "FILE:/tmp/krb5cc_fake",
    "SENTRY_DSN": "https://sentry-key-fake@o1.ingest.sentry.io/42",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/slack-hook-fake",
    "DISCORD_WEBHOOK": "https://discord.com/api/webhooks/1/discord-hook-fake",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-fake",
    "AWS_SESSION_TOKEN": "aws-session-fake",
    "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks-fake/token",
    "AZURE_CLIENT_SECRET": "azure-secret-fake",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=azure-conn-fake;EndpointSuffix=x",
    "ARM_CLIENT_SECRET": "arm-secret-fake",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/u/gcp-sa-fake.json",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.gcp-fake",
    "CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.cloudsdk-fake",
    "DIGITALOCEAN_ACCESS_TOKEN": "dop_v1_fake",
    "HCLOUD_TOKEN": "hcloud-fake",
    "CLOUDFLARE_API_TOKEN": "cf-fake",
    "HF_TOKEN": "hf_fake",
    "HUGGING_FACE_HUB_TOKEN": "hf_hub_fake",
    "OPENAI_API_KEY": "sk-openai-fake",
    "ANTHROPIC_API_KEY": "sk-ant-fake",
    "GEMINI_API_KEY": "gemini-fake",
    "MISTRAL_API_KEY": "mistral-fake",
    "COHERE_API_KEY": "cohere-fake",
    "REPLICATE_API_TOKEN": "r8_fake",
    "WANDB_API_KEY": "wandb-fake",
    "VAULT_TOKEN": "hvs.vault-fake",
    "VAULT_ADDR": "https://vault-user:vault-addr-pw-fake@vault.internal:8200",
    "CONSUL_HTTP_TOKEN": "consul-fake",
    "NOMAD_TOKEN": "nomad-fake",
    "TWINE_PASSWORD": "pypi-twine-fake",
    "TWINE_USERNAME": "__token__-fake",
    "POETRY_PYPI_TOKEN_PYPI": "pypi-poetry-fake",
    "UV_INDEX_PASSWORD": "uv-index-fake",
    "PIP_INDEX_URL": "https://pip-user:pip-index-pw-fake@pypi.internal/simple",
    "CARGO_REGISTRY_TOKEN": "cio-cargo-fake",
    "GEM_HOST_API_KEY": "rubygems-fake",
    "NUGET_API_KEY": "nuget-fake",
    "CODECOV_TOKEN": "codecov-fake",
    "SONAR_LOGIN": "sonar-login-fake",
    "SNYK_AUTH": "snyk-auth-fake",
    "STRIPE_SK": "sk_live_stripe-fake",
    "TWILIO_AUTH": "twilio-auth-fake",
    "SENDGRID_APIKEY": "SG.sendgrid-fake",
    "JWT_SIGNING": "jwt-signing-fake",
    "SESSION_COOKIE": "session-cookie-fake",
    "OP_SERVICE_ACCOUNT": "ops_1password-fake",
    "KUBECONFIG": "/home/u/.kube/config-fake",
    "DOCKER_HOST": "unix:///run/user/1000/docker-fake.sock",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus-fake",
    "XDG_RUNTIME_DIR": "/run/user/1000-fake",
    "DISPLAY": ":99-fake",
    "WAYLAND_DISPLAY": "wayland-fake",
    "JAVA_TOOL_OPTIONS": "-Djavax.net.ssl.trustStorePassword=java-tool-fake",
    "MAVEN_OPTS": "-Dhttp.proxyPassword=maven-opts-fake",
    # Allowed names whose value carries a credential: dropped by the value rule.
    "HTTPS_PROXY": "http://proxyuser:proxy-pw-fake@proxy.corp:3128",
    "http_proxy": "http://proxy-token-fake@proxy.corp:3128",
    "GOPROXY": "https://go-user:goproxy-pw-fake@goproxy.corp,direct",
    "NODE_EXTRA_CA_CERTS": "https://ca-user:ca-pw-fake@ca.corp/bundle.pem",
}

# What a command needs, as an executor environment would hold it.
ORDINARY: dict[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/u",
    "USER": "u",
    "LOGNAME": "u",
    "SHELL": "/bin/bash",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_MESSAGES": "C",
    "TZ": "UTC",
    "VIRTUAL_ENV": "/home/u/proj/.venv",
    "CARGO_HOME": "/home/u/.cargo",
    "LD_LIBRARY_PATH": "/opt/lib",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "NO_PROXY": "localhost,127.0.0.1,.corp",
    "HTTP_PROXY": "http://proxy.corp:3128",
    "CI": "true",
    "SOURCE_DATE_EPOCH": "1700000000",
    "XDG_CONFIG_HOME": "/home/u/.config",
}


def test_at_least_55_credential_names_are_covered() -> None:
    assert len(CREDENTIALS) >= 55
    # Most of them pass the local executor's name scrub: the reason for an allowlist.
    assert sum(is_inherited(name) for name in CREDENTIALS) >= 35


def test_no_credential_survives_the_allowlist() -> None:
    inherited = sandbox_inherited_env({**ORDINARY, **CREDENTIALS})
    survivors = {name for name, value in CREDENTIALS.items() if inherited.get(name) == value}
    assert survivors == set()
    assert inherited == ORDINARY


def test_value_with_url_userinfo_is_dropped_even_under_an_allowed_name() -> None:
    for value in (
        "http://u:p@proxy:3128",
        "https://token@proxy",
        "socks5h://u:p@[::1]:1080",
        "https://ok.example,https://u:p@bad.example",
        # Without the scheme: curl and Python read `http://`, Go's GOPROXY `https://`, and
        # each sends the userinfo (a red team's).
        "alice:S3cret@proxy.corp.example:3128",
        "tok@proxy:3128",
        "u:pa/ss@proxy:3128",
        "proxy.golang.org,carol:t0ken@goproxy.corp.example",
    ):
        for name in ("ALL_PROXY", "https_proxy", "GOPROXY"):
            assert sandbox_inherited_env({name: value}) == {}, (name, value)
    for value in ("http://proxy:3128", "proxy:3128", "https://x.example/@scope/p", "direct"):
        assert sandbox_inherited_env({"ALL_PROXY": value}) == {"ALL_PROXY": value}
    # Elsewhere an `@` without a scheme is not a URL's userinfo.
    assert sandbox_inherited_env({"EDITOR": "vim@9"}) == {"EDITOR": "vim@9"}


@pytest.mark.parametrize(
    "name",
    ["SSH_AUTH_SOCK", "XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"],
)
def test_host_socket_locators_are_not_inherited(name: str) -> None:
    assert name not in INHERITED_NAMES
    assert sandbox_inherited_env({name: "/run/x"}) == {}


def test_locale_prefix_is_exact() -> None:
    env = {"LC_ALL": "C", "LC_TIME": "C", "LC_": "x", "LCX": "x", "LC_all": "x", "LC_1": "x"}
    assert sandbox_inherited_env(env) == {"LC_ALL": "C", "LC_TIME": "C"}


def test_a_real_process_sees_no_credential_and_the_request_env_still_wins() -> None:
    host = {**ORDINARY, **CREDENTIALS, "PATH": "/usr/bin:/bin"}
    env = build_command_env(
        sandbox_inherited_env(host),
        {"OPENAI_API_KEY": "restored-on-purpose"},
        {"DSH_RUN": "7"},
    )
    seen = subprocess.run(
        ["/bin/cat", "/proc/self/environ"], env=env, capture_output=True, check=True, timeout=30
    ).stdout
    assert seen  # the process really ran with an environment
    leaked = [name for name, value in CREDENTIALS.items() if value.encode() in seen]
    assert leaked == []
    variables = dict(item.split(b"=", 1) for item in seen.split(b"\0") if item)
    assert variables[b"OPENAI_API_KEY"] == b"restored-on-purpose"  # the request's env wins
    assert variables[b"DSH_RUN"] == b"7"
    assert variables[b"VIRTUAL_ENV"] == ORDINARY["VIRTUAL_ENV"].encode()
    assert variables[b"LANG"] == b"C.UTF-8"
