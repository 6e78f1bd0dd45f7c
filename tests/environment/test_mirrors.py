"""`mirror_settings`: the user's index settings pass, their credentials never do."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bash_sandbox import mirrors as mirrors_module
from bash_sandbox.mirrors import (
    Mirrors,
    mirror_hint,
    mirror_hosts,
    mirror_settings,
    strip_userinfo,
)


def test_userinfo_is_cut_from_every_url() -> None:
    value = "https://u:p@a.example/simple https://tok@b.example/x http://c.example/"
    clean, cut = strip_userinfo(value)
    assert clean == "https://a.example/simple https://b.example/x http://c.example/"
    assert cut
    assert strip_userinfo("https://a.example/") == ("https://a.example/", False)
    # Without the scheme too: Go adds `https://` to a GOPROXY entry and sends its userinfo.
    assert strip_userinfo("carol:t0k/en@go.corp.example,direct") == (
        "go.corp.example,direct",
        True,
    )
    assert strip_userinfo("tok@a.example|off") == ("a.example|off", True)
    assert strip_userinfo("https://p.example/a@v,direct") == ("https://p.example/a@v,direct", False)


def test_environment_settings_pass_without_credentials(tmp_path: Path) -> None:
    environ = {
        "PIP_INDEX_URL": "https://alice:s3cret@pypi.corp.example/simple/",
        "UV_DEFAULT_INDEX": "https://pypi.corp.example/simple/",
        "npm_config_registry": "https://npm.corp.example/",
        "YARN_NPM_REGISTRY_SERVER": "https://npm.corp.example/",
        "GOPROXY": "https://x:y@go.corp.example,direct",
        "CARGO_REGISTRIES_CORP_INDEX": "sparse+https://cargo.corp.example/index/",
        "CARGO_REGISTRIES_CORP_TOKEN": "never-passed",
        "NPM_TOKEN": "never-passed",
    }
    out = mirror_settings(environ, home=str(tmp_path))
    assert out.env == {
        "PIP_INDEX_URL": "https://pypi.corp.example/simple/",
        "UV_DEFAULT_INDEX": "https://pypi.corp.example/simple/",
        "npm_config_registry": "https://npm.corp.example/",
        "YARN_NPM_REGISTRY_SERVER": "https://npm.corp.example/",
        "GOPROXY": "https://go.corp.example,direct",
        "CARGO_REGISTRIES_CORP_INDEX": "sparse+https://cargo.corp.example/index/",
    }
    assert "s3cret" not in repr(out) and "never-passed" not in repr(out)
    assert [w.split(" ")[0] for w in out.warnings] == ["PIP_INDEX_URL", "GOPROXY"]
    assert mirror_hosts(out.env) == [
        "pypi.corp.example",
        "npm.corp.example",
        "go.corp.example",
        "cargo.corp.example",
    ]
    assert "pypi.corp.example" in mirror_hint(mirror_hosts(out.env))


def test_pip_conf_index_lines_pass_and_the_environment_wins(tmp_path: Path) -> None:
    conf = tmp_path / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        "[global]\n"
        "index-url = https://bob:pw@devpi.corp.example/root/pypi/+simple/\n"
        "extra-index-url =\n    https://a.example/simple\n    https://b.example/simple\n"
        "trusted-host = devpi.corp.example\n"
        "client-cert = /home/bob/secret.pem\n"
        "[install]\n"
        "extra-index-url = https://c.example/simple\n"
    )
    out = mirror_settings({}, home=str(tmp_path))
    assert out.env == {
        "PIP_INDEX_URL": "https://devpi.corp.example/root/pypi/+simple/",
        "PIP_EXTRA_INDEX_URL": "https://c.example/simple",
        "PIP_TRUSTED_HOST": "devpi.corp.example",
    }
    assert "pw" not in repr(out.env) and "secret.pem" not in repr(out)
    (warning,) = out.warnings
    assert warning.startswith(f"PIP_INDEX_URL (from {conf})")

    env_wins = mirror_settings({"PIP_INDEX_URL": "https://env.example/"}, home=str(tmp_path))
    assert env_wins.env["PIP_INDEX_URL"] == "https://env.example/"
    assert env_wins.warnings == []  # the file's credentialed line was not used at all


def test_npmrc_registry_lines_pass_and_tokens_are_named_not_passed(tmp_path: Path) -> None:
    npmrc = tmp_path / ".npmrc"
    npmrc.write_text(
        "registry=https://npm.corp.example/\n"
        "@corp:registry=https://npm.corp.example/corp/\n"
        "//npm.corp.example/:_authToken=npm_SECRETSECRET\n"
        "//npm.corp.example/:_auth=dXNlcjpwdw==\n"
        "@env:registry=${REGISTRY}\n"
        "fund=false\n"
    )
    out = mirror_settings({}, home=str(tmp_path))
    assert out.env == {
        "npm_config_registry": "https://npm.corp.example/",
        "npm_config_@corp:registry": "https://npm.corp.example/corp/",
    }
    assert "SECRET" not in repr(out) and "dXNlcjpwdw" not in repr(out)
    assert out.warnings == [
        f"{npmrc}: //npm.corp.example/:_authToken not passed to the sandbox (a credential)",
        f"{npmrc}: //npm.corp.example/:_auth not passed to the sandbox (a credential)",
    ]


def test_a_token_in_the_path_or_query_drops_the_setting_with_a_warning(tmp_path: Path) -> None:
    environ = {
        "PIP_INDEX_URL": "https://pypi.fury.io/1a2B3c4D5e6F7g8H9i0JkLmN/acme/",
        "UV_INDEX_URL": "https://mirror.example/simple/?access_token=abc",
        "npm_config_registry": "https://npm.example/a-long-but-plain-registry-path/",
    }
    out = mirror_settings(environ, home=str(tmp_path))
    assert out.env == {"npm_config_registry": environ["npm_config_registry"]}
    assert [w.split(" ")[0] for w in out.warnings] == ["PIP_INDEX_URL", "UV_INDEX_URL"]
    assert "1a2B3c4D" not in repr(out.warnings)


def test_an_executor_is_warned_once_until_the_setting_changes(tmp_path: Path) -> None:
    mirrors = Mirrors(home=str(tmp_path))
    environ = {"PIP_INDEX_URL": "https://u:p@pypi.corp.example/simple/"}
    assert len(mirrors.settings(environ).warnings) == 1
    again = mirrors.settings(environ)
    assert again.warnings == [] and again.env == {
        "PIP_INDEX_URL": "https://pypi.corp.example/simple/"
    }
    assert len(mirrors.settings({"UV_INDEX_URL": "https://t@uv.example/"}).warnings) == 1


def _kept_right_away(monkeypatch: pytest.MonkeyPatch) -> None:
    # No two-second wait: the files below are trusted as soon as they are written.
    monkeypatch.setattr(mirrors_module, "SETTLE_NS", 0)
    time.sleep(0.01)


def test_an_unchanged_configuration_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".npmrc").write_text("registry=https://npm.corp.example/\n")
    _kept_right_away(monkeypatch)
    mirrors = Mirrors(home=str(tmp_path))
    first = mirrors.settings({})
    assert first.env == {"npm_config_registry": "https://npm.corp.example/"}
    first.env["npm_config_registry"] = "changed by a caller"  # a copy: the kept one holds
    assert mirrors.settings({}).env == {"npm_config_registry": "https://npm.corp.example/"}
    assert mirrors.hits == 1


@pytest.mark.parametrize("change", ["edit", "edit, old times put back", "remove", "new pip.conf"])
def test_a_changed_file_is_read_again_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    npmrc = tmp_path / ".npmrc"
    npmrc.write_text("registry=https://npm.corp.example/\n")
    _kept_right_away(monkeypatch)
    mirrors = Mirrors(home=str(tmp_path))
    assert mirrors.settings({}).env == {"npm_config_registry": "https://npm.corp.example/"}
    before = npmrc.stat()
    expected: dict[str, str] = {"npm_config_registry": "https://npm.other.example/"}
    if change.startswith("edit"):
        npmrc.write_text("registry=https://npm.other.example/\n")  # same size
        if change != "edit":
            os.utime(npmrc, ns=(before.st_atime_ns, before.st_mtime_ns))  # the ctime moves
    elif change == "remove":
        npmrc.unlink()
        expected = {}
    else:
        conf = tmp_path / ".config" / "pip" / "pip.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text("[global]\nindex-url = https://pypi.corp.example/simple/\n")
        expected = {
            "npm_config_registry": "https://npm.corp.example/",
            "PIP_INDEX_URL": "https://pypi.corp.example/simple/",
        }
    assert mirrors.settings({}).env == expected
    assert mirrors.hits == 0


def test_a_changed_environment_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kept_right_away(monkeypatch)
    mirrors = Mirrors(home=str(tmp_path))
    assert mirrors.settings({"GOPROXY": "https://go.corp.example"}).env == {
        "GOPROXY": "https://go.corp.example"
    }
    assert mirrors.settings({"GOPROXY": "https://go2.corp.example"}).env == {
        "GOPROXY": "https://go2.corp.example"
    }
    other = tmp_path / "elsewhere.npmrc"
    other.write_text("registry=https://npm.else.example/\n")
    assert mirrors.settings({"NPM_CONFIG_USERCONFIG": str(other)}).env == {
        "npm_config_registry": "https://npm.else.example/"
    }
    assert mirrors.hits == 0


def test_a_file_changed_just_now_is_never_kept(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_text("registry=https://npm.corp.example/\n")
    mirrors = Mirrors(home=str(tmp_path))
    for _ in range(3):
        assert mirrors.settings({}).env == {"npm_config_registry": "https://npm.corp.example/"}
    assert mirrors.hits == 0  # within the settle window: read on every spawn
