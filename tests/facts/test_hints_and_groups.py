"""Hints are never denials; denials are grouped so a noisy run reads in a few lines.

Pure parts on constructed records (the supervisor's loopback connects, a browser's worth of
denials, /proc/net/tcp), then real commands through `SandboxBashExecutor` on both Linux
backends: the exact forged refusal line, and a run refused thirty times.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.facts import (
    group_denials,
    host_tcp_listeners,
    loopback_destinations,
    loopback_hints,
    requested_names,
    resolve_hints,
    result_markers,
    summarize,
)
from bash_sandbox.facts.markers import denial_marker
from bash_seam import (
    BashExecRequest,
    DenialEvidence,
    DenialKind,
    HintSource,
    SandboxDenial,
    SandboxFacts,
    SandboxHint,
)
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend

WS = "/srv/ws"


def _d(
    kind: DenialKind,
    target: str,
    reason: str = "isolated network",
    evidence: DenialEvidence = DenialEvidence.SUPERVISOR,
    operation: str | None = "connect",
) -> SandboxDenial:
    return SandboxDenial(
        kind=kind, target=target, reason=reason, evidence=evidence, operation=operation
    )


def _browser_denials() -> list[SandboxDenial]:
    """What a headless browser's successful run is refused: route sockets, lookups through
    the resolver, background services, the session bus."""
    netlink = [
        _d(
            DenialKind.SOCKET,
            f"AF_NETLINK type 3 protocol {p}",
            "socket family or type outside the sandbox's list",
            operation="socket",
        )
        for p in (0, 9, 15)
    ]
    dns = [_d(DenialKind.NETWORK_RESOLVE, "10.0.0.2:53") for _ in range(20)]
    services = [_d(DenialKind.NETWORK_CONNECT, f"142.250.{i}.1:443") for i in range(40)]
    bus = [
        _d(DenialKind.SOCKET, p, "host unix socket outside the writable roots")
        for p in ("/run/dbus/system_bus_socket", "/run/user/0/bus")
    ]
    return [*netlink, *dns, *services, *bus] * 2


def test_a_browsers_refusals_read_in_a_few_lines() -> None:
    every = _browser_denials()
    lists = summarize(every, len(every))
    assert len(lists.denials) == 16 and lists.total == len(every)  # bounded, all counted
    assert [(g.kind, g.place, g.count) for g in lists.groups] == [
        (DenialKind.SOCKET, "AF_NETLINK", 3),
        (DenialKind.NETWORK_RESOLVE, "", 1),
        (DenialKind.NETWORK_CONNECT, "", 40),
        (DenialKind.SOCKET, "/run/dbus", 1),
        (DenialKind.SOCKET, "/run/user/0", 1),
    ]
    facts = SandboxFacts(
        mode="workspace-write",
        denied=False,
        enforcement="full",
        network="isolated",
        denials=lists.denials,
        denials_total=lists.total,
        denial_groups=lists.groups,
    )
    lines = result_markers(facts)
    assert len(lines) == 6, lines
    assert lines[2] == (
        "[sandbox: 40 connects denied under isolated network: 142.250.0.1:443, 142.250.1.1:443, "
        "142.250.2.1:443 and 37 more; ask for network=host or add the domain to allow_domains]"
    )
    assert lines[0].startswith("[sandbox: 3 sockets of AF_NETLINK denied (socket family")
    # The repeats are counted, not listed.
    extra = len(every) - 46
    assert lines[-1] == f"[sandbox: {extra} more refusal(s) counted (repeats, or beyond the list)]"


def test_a_group_of_one_is_the_single_denials_line() -> None:
    one = _d(DenialKind.FILE_WRITE, "/srv/ws/.git/info/exclude", "git control plane (info)",
             DenialEvidence.OVERLAY, "write")  # fmt: skip
    (group,) = group_denials([one, one])
    assert group.count == 1
    facts = SandboxFacts(
        mode="workspace-write", denied=False, enforcement="full", denials=(one,),
        denials_total=1, denial_groups=(group,),
    )  # fmt: skip
    assert result_markers(facts) == [denial_marker(one, "workspace-write", "host")]
    assert "change them outside the sandbox" in result_markers(facts)[0]


def test_files_group_by_directory_and_show_their_names() -> None:
    hooks = [
        _d(DenialKind.FILE_WRITE, f"/srv/ws/.git/modules/m/hooks/{n}.sample",
           "git control plane (hooks)", DenialEvidence.OVERLAY, "write")
        for n in ("a", "b", "c", "d", "e")
    ]  # fmt: skip
    (group,) = group_denials(hooks)
    facts = SandboxFacts(
        mode="workspace-write", denied=False, enforcement="full", denials=tuple(hooks),
        denials_total=5, denial_groups=(group,),
    )  # fmt: skip
    assert result_markers(facts) == [
        "[sandbox: 5 writes in /srv/ws/.git/modules/m/hooks denied (git control plane (hooks)) "
        "under workspace-write mode: a.sample, b.sample, c.sample and 2 more; git config, hooks "
        "and info stay the host's; change them outside the sandbox]"
    ]


def test_a_hint_the_witnessed_denial_already_says_is_dropped() -> None:
    denial = _d(DenialKind.FILE_WRITE, f"{WS}/sub/rel.txt", "read-only mode", operation="open")
    same = SandboxHint(kind=DenialKind.FILE_WRITE, target=f"{WS}/sub/rel.txt", reason="x")
    relative = SandboxHint(
        kind=DenialKind.FILE_WRITE, target="rel.txt", relative=True, reason="read-only mode"
    )
    other = SandboxHint(kind=DenialKind.FILE_WRITE, target="/etc/x", reason="outside")
    lists = summarize([denial], 1, [same, relative, other, other])
    assert lists.hints == (other,)
    up = SandboxHint(
        kind=DenialKind.FILE_WRITE, target="../sub/rel.txt", relative=True, reason="outside"
    )
    assert summarize([denial], 1, [up]).hints == ()
    unrelated = SandboxHint(kind=DenialKind.FILE_WRITE, target="x.txt", relative=True, reason="")
    assert summarize([denial], 1, [unrelated]).hints == (unrelated,)
    assert summarize([], 0, [relative]).hints == (relative,)


def test_hints_render_apart_from_denials_and_never_as_the_generic_marker() -> None:
    hint = SandboxHint(
        kind=DenialKind.FILE_WRITE, target="/etc/x", reason="outside the writable roots"
    )
    relative = SandboxHint(
        kind=DenialKind.FILE_WRITE, target="rel.txt", relative=True, reason="read-only mode"
    )
    facts = SandboxFacts(mode="read-only", denied=False, enforcement="full", hints=(hint, relative))
    assert result_markers(facts) == [
        "[sandbox hint: the output says a write to /etc/x failed (outside the writable roots "
        "under read-only mode); no refusal was seen; if it was refused: add it to "
        "writable_roots or ask for danger-full-access]",
        "[sandbox hint: the output says a write to rel.txt (relative to the directory the tool "
        "was in) failed (read-only mode); no refusal was seen; if it was refused: ask for "
        "workspace-write]",
    ]
    assert not any(line.startswith("[sandbox:") for line in result_markers(facts))


# -- loopback the host serves ------------------------------------------------------------


def _proc_net(tmp_path: Path, tcp: list[str], tcp6: list[str]) -> str:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    (tmp_path / "tcp").write_text(header + "".join(f"{line}\n" for line in tcp))
    (tmp_path / "tcp6").write_text(header + "".join(f"{line}\n" for line in tcp6))
    return str(tmp_path)


def test_proc_net_tcp_listeners_are_parsed_in_host_order(tmp_path: Path) -> None:
    root = _proc_net(
        tmp_path,
        [
            "0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0",  # 5432
            "1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0",  # *:80
            "2: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000 0",  # estab.
        ],
        ["0: 00000000000000000000000001000000:0BB8 00000000000000000000000000000000:0000 0A x"],
    )
    assert host_tcp_listeners(root) == {("127.0.0.1", 5432), ("0.0.0.0", 80), ("::1", 3000)}
    assert host_tcp_listeners(str(tmp_path / "missing")) == frozenset()


def test_a_real_host_listener_is_seen() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert ("127.0.0.1", port) in host_tcp_listeners()
    assert ("127.0.0.1", port) not in host_tcp_listeners()


def test_loopback_hints_from_a_supervisor_record() -> None:
    # The record the supervisor would keep of loopback connects: "host:port" strings.
    listeners = frozenset({("127.0.0.1", 5432), ("0.0.0.0", 8080), ("::1", 3000)})
    record = ["127.0.0.1:5432", "127.0.0.1:8080", "[::1]:3000", "127.0.0.1:9999", "junk"]
    hints = loopback_hints(record, private_loopback=True, listeners=listeners)
    assert [(h.target, h.source) for h in hints] == [
        ("127.0.0.1:5432", HintSource.HOST_LISTENER),
        ("127.0.0.1:8080", HintSource.HOST_LISTENER),
        ("[::1]:3000", HintSource.HOST_LISTENER),
    ]
    # Under the host network the command reached the host's listener itself.
    assert loopback_hints(record, private_loopback=False, listeners=listeners) == []
    facts = SandboxFacts(mode="read-only", denied=False, enforcement="full", hints=hints[:1])
    assert result_markers(facts) == [
        "[sandbox hint: the host serves 127.0.0.1:5432; this sandbox has its own loopback; "
        "ask for network=host]"
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("curl: (7) Failed to connect to 127.0.0.1 port 8080 after 0 ms: Couldn't connect to "
         "server", "127.0.0.1:8080"),
        ("Error: connect ECONNREFUSED 127.0.0.1:3000", "127.0.0.1:3000"),
        ('psql: error: connection to server at "localhost", port 5432 failed: Connection '
         "refused", "127.0.0.1:5432"),
        ("HTTPConnectionPool(host='localhost', port=8000): Max retries exceeded ... "
         "[Errno 111] Connection refused", "127.0.0.1:8000"),
        ("dial tcp [::1]:6379: connect: connection refused", "[::1]:6379"),
    ],
)  # fmt: skip
def test_loopback_destinations_in_tool_output(line: str, expected: str) -> None:
    assert loopback_destinations("", line) == [expected]


def test_a_loopback_address_without_a_refusal_is_no_destination() -> None:
    assert loopback_destinations("serving on 127.0.0.1:8000\n", "") == []
    assert loopback_destinations("", "ConnectionRefusedError: [Errno 111] Connection refused") == []


# -- the name behind a refused lookup ----------------------------------------------------


def test_requested_names_from_tool_output() -> None:
    stderr = (
        "curl: (6) Could not resolve host: example.com\n"
        "npm error request to https://registry.npmjs.org/left-pad failed, reason: getaddrinfo "
        "EAI_AGAIN registry.npmjs.org\n"
        "fatal: unable to access 'https://github.com/o/r/': Could not resolve host: github.com\n"
        "dial tcp: lookup proxy.golang.org on 10.0.0.2:53: dial udp 10.0.0.2:53: connect: "
        "network is unreachable\n"
    )
    assert requested_names("", stderr) == [
        "example.com",
        "github.com",
        "registry.npmjs.org",
        "proxy.golang.org",
    ]


def test_names_are_hints_only_beside_a_witnessed_lookup_denial() -> None:
    out = "curl: (6) Could not resolve host: example.com"
    assert resolve_hints("", out, []) == []  # printed text alone: nothing
    resolver = _d(DenialKind.NETWORK_RESOLVE, "10.0.0.2:53")
    (hint,) = resolve_hints("", out, [resolver])
    assert (hint.kind, hint.target) == (DenialKind.NETWORK_RESOLVE, "example.com")
    lists = summarize([resolver], 2, [hint])
    facts = SandboxFacts(
        mode="workspace-write", denied=False, network_denied=True, enforcement="full",
        network="isolated", denials=lists.denials, denials_total=lists.total,
        denial_groups=lists.groups, hints=lists.hints,
    )  # fmt: skip
    assert result_markers(facts) == [
        "[sandbox: lookup of example.com denied under isolated network (the resolver "
        "10.0.0.2:53 was refused; the name is the output's); ask for network=host or add the "
        "domain to allow_domains]",
    ]  # the second attempt (AAAA after A) is a repeat: counted, no line


# -- real commands -----------------------------------------------------------------------

FORGED = "bash: /etc/x: Read-only file system"


@pytest.mark.parametrize("backend", LINUX_BACKENDS)
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_the_forged_refusal_line_makes_no_denial(
    backend: str, mode: str, tmp_path: Path
) -> None:
    require_backend(backend)
    ws = tmp_path / "ws"
    ws.mkdir()
    async with SandboxBashExecutor(backend=backend, mode=mode, workspace_root=str(ws)) as ex:
        result = await ex.run(
            ex.resolve(BashExecRequest(command=f"echo '{FORGED}' >&2; exit 1", workdir=str(ws)))
        )
    facts = result.sandbox
    assert facts is not None and result.exit_code == 1 and FORGED in result.stderr.text
    assert (facts.denied, facts.network_denied, facts.denials, facts.denials_total) == (
        False,
        False,
        (),
        0,
    )
    assert [(h.kind, h.target, h.source) for h in facts.hints] == [
        (DenialKind.FILE_WRITE, "/etc/x", HintSource.OUTPUT)
    ]
    lines = result_markers(facts)
    assert len(lines) == 1 and lines[0].startswith("[sandbox hint: ")
    # From the host: nothing was written, nothing else happened.
    assert not os.path.lexists("/etc/x")
    assert os.listdir(ws) == []


@pytest.mark.parametrize("backend", LINUX_BACKENDS)
async def test_thirty_refused_connects_read_in_two_lines(backend: str, tmp_path: Path) -> None:
    require_backend(backend)
    # 192.0.2.0/24 is TEST-NET-1: the supervisor refuses each connect before any packet.
    command = "for i in $(seq 1 30); do echo > /dev/tcp/192.0.2.$i/443; done 2>/dev/null; true"
    async with SandboxBashExecutor(backend=backend, workspace_root=str(tmp_path)) as ex:
        result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(tmp_path))))
    facts = result.sandbox
    assert facts is not None and result.exit_code == 0
    assert facts.denials_total == 30 and len(facts.denials) == 16
    (group,) = facts.denial_groups
    assert (group.kind, group.evidence, group.count) == (
        DenialKind.NETWORK_CONNECT,
        DenialEvidence.SUPERVISOR,
        16,
    )
    assert group.targets == ("192.0.2.1:443", "192.0.2.2:443", "192.0.2.3:443")
    assert result_markers(facts) == [
        "[sandbox: 16 connects denied under isolated network: 192.0.2.1:443, 192.0.2.2:443, "
        "192.0.2.3:443 and 13 more; ask for network=host or add the domain to allow_domains]",
        "[sandbox: 14 more refusal(s) counted (repeats, or beyond the list)]",
    ]


@pytest.mark.parametrize("reason", ["protected name .git", "protected name .git/config"])
def test_a_refused_git_config_write_says_where_to_change_it_not_to_widen_the_mode(
    reason: str,
) -> None:
    # `git switch -c feat origin/main` renames `config.lock` over `.git/config` (EBUSY): the
    # step said "ask for danger-full-access" for branch tracking (a usability pass).
    lock = _d(DenialKind.FILE_WRITE, "/srv/ws/.git/config", reason, DenialEvidence.SUPERVISOR)
    line = denial_marker(lock, "workspace-write", "isolated")
    assert line.endswith(
        "run that git command on the host (`git submodule init`, `git remote add`, "
        "`git branch -u`, `git config`), then go on here]"
    )
    assert "danger-full-access" not in line


@pytest.mark.parametrize(
    ("reason", "step"),
    [
        ("the sandbox's own installation, which the harness runs next: /p/.venv", "pipx, uv tool"),
        ("git config: host git runs /p/tools/d.sh (diff.external)", "change it on the host"),
    ],
)
def test_a_refusal_no_wider_mode_lifts_says_what_does(reason: str, step: str) -> None:
    denial = _d(DenialKind.FILE_WRITE, "/p/x", reason, DenialEvidence.SUPERVISOR)
    line = denial_marker(denial, "workspace-write", "isolated")
    assert step in line and "wider mode" not in line


def test_a_tools_own_state_in_the_home_says_how_to_move_it() -> None:
    # Chromium's profile under ~/.config: the step said "add it to writable_roots or ask for
    # danger-full-access", where `--user-data-dir` was all it took (a usability pass).
    home = os.path.expanduser("~")
    browser = _d(
        DenialKind.FILE_WRITE,
        f"{home}/.config/chromium-headless/scoped_dir1/x",
        "outside the writable roots",
        DenialEvidence.SUPERVISOR,
    )
    line = denial_marker(browser, "workspace-write", "isolated")
    assert "--user-data-dir=$(mktemp -d)" in line and "danger-full-access" not in line
    tool = _d(
        DenialKind.FILE_WRITE,
        f"{home}/.cache/sometool/state.db",
        "outside the writable roots",
        DenialEvidence.SUPERVISOR,
    )
    assert "XDG_CACHE_HOME" in denial_marker(tool, "workspace-write", "isolated")
    elsewhere = _d(
        DenialKind.FILE_WRITE, "/etc/hosts", "outside the writable roots", DenialEvidence.SUPERVISOR
    )
    assert denial_marker(elsewhere, "workspace-write", "isolated").endswith(
        "add it to writable_roots or ask for danger-full-access]"
    )
