"""Denial facts and hints of real commands on both Linux backends, against the live corpus.

Every case of `live_cases.py` runs through the real `SandboxBashExecutor` (real bwrap, real
Landlock, the real seccomp supervisor, git overlays, and output inference); the result's
denials and hints are compared with the label as ``(kind, target)`` sets, the evidence is
checked where only one source can see the refusal, no denial rests on the output alone,
and the flags keep their contract meaning.
The host is checked from outside too: refused files are absent, host git state unchanged,
the test's own servers saw nothing, no secret reached the output. Precision and recall
over the corpus must both be 100% on each backend; they are printed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest, BashRunResult
from policies import default_deny_read
from tests.facts.evidence import WRITE_INTENT_WITNESSED
from tests.facts.live_cases import LIVE_CASES, Expected, LiveCase
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend
from tests.sandbox.test_network import CountingServer

# The base interpreter for stdlib-only scripts; the venv's for pytest (see test_network).
PY = os.path.realpath(sys.executable)
VENV_PY = sys.executable
SECRET = f"live-corpus-secret-{os.getpid()}"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Live Corpus",
    "GIT_AUTHOR_EMAIL": "live@corpus.invalid",
    "GIT_COMMITTER_NAME": "Live Corpus",
    "GIT_COMMITTER_EMAIL": "live@corpus.invalid",
}

Denial = tuple[str, str]


def _nameservers() -> list[str]:
    """The resolvers glibc tries, named as the supervisor names a connect to them."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return []
    found = [p[1] for p in (line.split() for line in lines) if len(p) > 1 and p[0] == "nameserver"]
    return [f"[{ns}]:53" if ":" in ns else f"{ns}:53" for ns in found[:3]]


@dataclass
class Layout:
    """One case's directories and the values its placeholders take."""

    root: Path
    port: int = 0

    @property
    def ws(self) -> Path:
        return self.root / "ws"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    def fill(self, text: str) -> str:
        values = {
            "{ws}": str(self.ws),
            "{outside}": str(self.outside),
            "{py}": PY,
            "{venv_py}": VENV_PY,
            "{port}": str(self.port),
        }
        for key, value in values.items():
            text = text.replace(key, value)
        return text


def _snapshot(path: Path) -> str:
    """A digest of a file, or of a directory tree: names, modes, sizes, mtimes and bytes
    (bytes where readable: a mode 000 file still shows a write in its size and mtime)."""
    digest = hashlib.sha256()
    paths = [path] if not path.is_dir() else [path, *sorted(path.rglob("*"))]
    for p in paths:
        st = p.lstat()
        digest.update(f"{p.relative_to(path)} {st.st_mode} {st.st_size} {st.st_mtime_ns}".encode())
        if p.is_file() and not p.is_symlink() and os.access(p, os.R_OK):
            digest.update(p.read_bytes())
    return digest.hexdigest()


def _make_layout(case: LiveCase, layout: Layout) -> None:
    layout.ws.mkdir(parents=True)
    (layout.outside / "secrets").mkdir(parents=True)
    (layout.outside / "secret.txt").write_text(SECRET)
    (layout.outside / "secrets" / "key").write_text(SECRET)
    locked = layout.ws / "locked"
    locked.write_text("L")
    locked.chmod(0)
    for rel, text in case.files:
        path = layout.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(layout.fill(text))
    if case.setup:
        subprocess.run(
            layout.fill(case.setup),
            shell=True,
            cwd=layout.ws,
            check=True,
            capture_output=True,
            env={**os.environ, **GIT_ENV},
            timeout=60,
        )


@dataclass
class Score:
    """Labels matched, denials or hints nobody labelled, labels nothing matched."""

    matched: int = 0
    unlabelled: int = 0
    missing: int = 0


@dataclass
class CaseOutcome:
    case: LiveCase
    denials: Score
    hints: Score
    problems: list[str] = field(default_factory=list)


def _compare(what: str, found: set[Denial], labels: set[Denial], problems: list[str]) -> Score:
    """Match what the result lists against the labels (shell patterns: a supervisor names
    some files it saw refused by a random name, ``tmp_objdir-incoming-*``)."""

    def hit(item: Denial, label: Denial) -> bool:
        return item[0] == label[0] and fnmatch.fnmatchcase(item[1], label[1])

    unlabelled = sorted(f for f in found if not any(hit(f, label) for label in labels))
    missing = sorted(label for label in labels if not any(hit(f, label) for f in found))
    if unlabelled or missing:
        problems.append(f"{what}: {sorted(found)} != label {sorted(labels)}")
    return Score(len(labels) - len(missing), len(unlabelled), len(missing))


def _labels(case: LiveCase, layout: Layout) -> tuple[dict[Denial, Expected], set[Denial]]:
    """The denials (with their labels) and hints this build must report. A hint the
    supervisor witnesses once it sees write intent becomes its denial(s) then."""
    denials: dict[Denial, Expected] = {}
    hints: set[Denial] = set()
    for e in case.expected:
        if e.fact == "denial":
            filled = _nameservers() if e.target == "{nameserver}" else [layout.fill(e.target)]
            denials |= {(e.kind, target): e for target in filled}
            continue
        witnessed = WRITE_INTENT_WITNESSED and bool(e.witnessed)
        if witnessed:
            denials |= {
                (e.kind, layout.fill(p)): Expected(e.kind, p, "supervisor") for p in e.witnessed
            }
        if not witnessed or e.stays:
            hints.add((e.kind, layout.fill(e.target)))
    return denials, hints


def _serve(case: LiveCase, layout: Layout) -> CountingServer | None:
    if case.serves == "tcp":
        server = CountingServer(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
        layout.port = server.address[1]  # type: ignore[index]
        return server
    if case.serves is not None:
        kind = socket.SOCK_STREAM if case.serves == "unix-stream" else socket.SOCK_DGRAM
        return CountingServer(socket.AF_UNIX, kind, str(layout.outside / "host.sock"))
    return None


async def _run(case: LiveCase, backend: str, layout: Layout) -> BashRunResult:
    secrets = (str(layout.outside / "secret.txt"), str(layout.outside / "secrets"))
    async with SandboxBashExecutor(
        backend=backend,
        mode=case.mode,
        workspace_root=str(layout.ws),
        deny_read=(*default_deny_read(), *secrets),
        grace_ms=500,
    ) as ex:
        request = BashExecRequest(
            command=layout.fill(case.command), timeout_ms=120_000, env=GIT_ENV
        )
        return await ex.run(ex.resolve(request))


def _judge(
    case: LiveCase, layout: Layout, result: BashRunResult, before: dict[str, str]
) -> CaseOutcome:
    facts = result.sandbox
    assert facts is not None
    labels, hinted = _labels(case, layout)
    problems: list[str] = []
    denials = {(d.kind.value, d.target) for d in facts.denials}
    hints = {(h.kind.value, h.target) for h in facts.hints}
    outcome = CaseOutcome(
        case,
        _compare("denials", denials, set(labels), problems),
        _compare("hints", hints, hinted, problems),
        problems,
    )
    # Every denial is witnessed: the output alone never makes one.
    problems += [f"{d.target}: inferred denial" for d in facts.denials if d.evidence == "inferred"]
    for d in facts.denials:
        for (kind, pattern), label in labels.items():
            wanted = label.evidence
            if (
                kind == d.kind.value
                and fnmatch.fnmatchcase(d.target, pattern)
                and wanted not in (None, d.evidence.value)
            ):
                problems.append(f"{d.target}: evidence {d.evidence.value}, not {wanted}")
    # A failed run whose refusal the supervisor witnessed is denied.
    denied = case.denied or (
        WRITE_INTENT_WITNESSED
        and not case.exit_zero
        and any(e.witnessed for e in case.expected if e.kind in ("file-write", "file-read"))
    )
    if (facts.denied, facts.network_denied) != (denied, case.network_denied):
        problems.append(
            f"denied={facts.denied} network_denied={facts.network_denied}, "
            f"expected {denied}/{case.network_denied}"
        )
    if (result.exit_code == 0) != case.exit_zero:
        problems.append(f"premise: exit {result.exit_code}")
    streams = {"stdout": result.stdout.text, "stderr": result.stderr.text}
    if case.shows and not any(layout.fill(text) in streams[s] for s, text in case.shows):
        problems.append(f"premise: none of {case.shows} printed")
    if any(SECRET in text for text in streams.values()):
        problems.append("a deny_read secret reached the output")
    for path in case.absent:
        if os.path.lexists(layout.fill(path)):
            problems.append(f"host: {layout.fill(path)} exists")
    for path, digest in before.items():
        if _snapshot(Path(path)) != digest:
            problems.append(f"host: {path} changed")
    if problems:
        problems.append(
            f"stdout={result.stdout.text[-400:]!r} stderr={result.stderr.text[-400:]!r}"
        )
    return outcome


async def _run_case(case: LiveCase, backend: str, layout: Layout) -> CaseOutcome:
    _make_layout(case, layout)
    server = _serve(case, layout)
    try:
        before = {layout.fill(p): _snapshot(Path(layout.fill(p))) for p in case.unchanged}
        result = await _run(case, backend, layout)
        outcome = _judge(case, layout, result, before)
    finally:
        if server is not None:
            server.close()
    if server is not None and server.hits:
        outcome.problems.append(f"host: the test's {case.serves} server saw {server.hits} hit(s)")
    return outcome


def _unrunnable(case: LiveCase) -> str | None:
    """Why this host cannot run ``case``, else None. In CI only an optional tool (cargo,
    go) may be missing: a missing node or npm fails, as a missing backend does."""
    if shutil.which(case.tool) is None:
        if case.optional or not os.environ.get("CI"):
            return f"{case.tool} is not installed"
        pytest.fail(f"{case.tool} must be installed to run the live corpus case {case.name}")
    if any(e.target == "{nameserver}" for e in case.expected) and not _nameservers():
        return "no nameserver in /etc/resolv.conf: the resolver is the sandbox's own loopback"
    return None


def _cleanup(root: Path) -> None:
    # Mode 000 entries in the layout: give them back their bits so the root can be removed.
    for path in root.rglob("locked*"):
        path.chmod(0o700)


@pytest.mark.parametrize("backend", LINUX_BACKENDS)
async def test_live_corpus_precision_and_recall_are_100_percent(backend: str) -> None:
    require_backend(backend)
    outcomes: list[CaseOutcome] = []
    skipped: list[str] = []
    for case in LIVE_CASES:
        reason = _unrunnable(case)
        if reason is not None:
            skipped.append(f"{case.name} ({reason})")
            continue
        # Short: a unix socket's path must fit in 108 bytes, and pytest-xdist's tmp_path
        # with a case name does not.
        root = Path(tempfile.mkdtemp(prefix="bash-sandbox-live-"))
        try:
            outcomes.append(await _run_case(case, backend, Layout(root)))
        finally:
            _cleanup(root)
            shutil.rmtree(root, ignore_errors=True)
    scores = {
        "denials": _score([o.denials for o in outcomes]),
        "hints": _score([o.hints for o in outcomes]),
    }
    with_denials = sum(1 for o in outcomes if o.denials.matched + o.denials.missing)
    with_hints = sum(1 for o in outcomes if o.hints.matched + o.hints.missing)
    look_alikes = sum(
        1 for o in outcomes if not o.case.expected and not o.denials.unlabelled + o.hints.unlabelled
    )
    print(
        f"\nlive corpus on {backend}: {len(outcomes)} cases ({with_denials} with denials, "
        f"{with_hints} with hints, {look_alikes} look-alikes); "
        + "; ".join(
            f"{name}: {n} labelled, precision {p:.1%}, recall {r:.1%}"
            for name, (n, p, r) in scores.items()
        )
        + ("; write intent witnessed" if WRITE_INTENT_WITNESSED else "")
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )
    failures = [f"{o.case.name}: " + "; ".join(o.problems) for o in outcomes if o.problems]
    assert not failures, "\n".join(failures)
    assert with_denials >= 8 and with_hints >= 8 and look_alikes >= 5
    assert all((p, r) == (1.0, 1.0) for _, p, r in scores.values())


def _score(scores: list[Score]) -> tuple[int, float, float]:
    """(labelled, precision, recall) over the cases' scores."""
    true_positive = sum(s.matched for s in scores)
    false_positive = sum(s.unlabelled for s in scores)
    false_negative = sum(s.missing for s in scores)
    precision = true_positive / ((true_positive + false_positive) or 1)
    recall = true_positive / ((true_positive + false_negative) or 1)
    return true_positive + false_negative, precision, recall
