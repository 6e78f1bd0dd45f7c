"""What the warm CLI's client and daemon share: where the socket is, and the frames on it.

Imported by the client before it connects, so only modules that import nothing more:
`_socket` and `_json` rather than `socket`, `json` and `contextlib` (which
bring `enum`, `re`, `functools` and `collections`: 15-20 ms of the client's start on this
VM). No pydantic, no asyncio, nothing of the sandbox.

The socket lives in this uid's private directory (`bash_local.userdir`: `<tmp>/bash-sandbox-
<uid>`, 0700, owned by the uid), named after the interpreter and the package directory, so
two installations never share a daemon. Frames are a 4-byte big-endian length and a JSON
object; the request's first frame carries the client's descriptors (stdin, stdout, stderr
and its working directory) as SCM_RIGHTS. Frames are written by `_encode` (the bytes
`json.dumps` with ASCII output and no spaces would write); the daemon reads what a client
sends with `json.loads`; a client reads the daemon's answers, flat objects of numbers and
booleans, with `_flat_object`, which accepts nothing else.
"""

from __future__ import annotations

import _socket
import os
import stat
import struct
import sys
import time
import zlib
from _json import encode_basestring_ascii as _quote

TYPE_CHECKING = False  # typing, collections.abc: not on the client's path (see above)
if TYPE_CHECKING:
    from typing import Any

ENABLE_ENV = "BASH_SANDBOX_DAEMON"  # "1": `bash-sandbox run` goes through the daemon
IDLE_ENV = "BASH_SANDBOX_DAEMON_IDLE_S"  # seconds the daemon stays without a client
# Set by the native client (`native/client.c`) when it hands a call to the Python entry: the
# directory its daemon is named after. The entry removes it from its environment at once.
KEY_ENV = "BASH_SANDBOX_WARM_KEY"
DEFAULT_IDLE_S = 600.0
MAX_FRAME = 64 << 20  # a request carries the whole command and environment
_HEADER = struct.Struct(">I")
_UCRED = struct.Struct("3i")  # pid, uid, gid
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WireError(OSError):
    """The other end broke the protocol or went away mid-frame."""


def private_dir(uid: int | None = None) -> str | None:
    """This uid's existing private directory, or None (the daemon makes it, never the
    client: a client only trusts a directory that only its uid could have filled)."""
    uid = os.geteuid() if uid is None else uid
    name = f"bash-sandbox-{uid}"
    for parent in dict.fromkeys((os.environ.get("TMPDIR") or "/tmp", "/tmp", "/var/tmp")):
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            return os.path.realpath(path)
    return None


def socket_name(key: str | None = None) -> str:
    """One daemon per installation: named after the native client's directory (``key``,
    `KEY_ENV`), which it finds without an interpreter, or else after the interpreter and the
    package directory."""
    raw = key if key is not None else f"{os.path.realpath(sys.executable)}\0{_PACKAGE}"
    return f"warm-{zlib.crc32(os.fsencode(raw)):08x}.sock"


_SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes with the terminator; a margin


def at_path(sock: _socket.socket, path: str, *, bind: bool) -> None:
    """`bind` or `connect` ``sock`` to ``path``: a deep temp dir makes it longer than a
    socket address holds, so then through a descriptor of its directory."""
    act = sock.bind if bind else sock.connect
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        act(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        act(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def _encode(value: object) -> str:
    """``value`` (str, int, bool, None, a list of these, a str-keyed dict of these) as
    compact ASCII JSON, as `json.dumps(value, separators=(",", ":"))` writes it."""
    if isinstance(value, str):
        return _quote(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else ("true" if value else "false")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(_encode, value)) + "]"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"frame keys are strings, not {type(key).__name__}")
            items.append(f"{_quote(key)}:{_encode(item)}")
        return "{" + ",".join(items) + "}"
    raise TypeError(f"not a frame value: {type(value).__name__}")


_INT = struct.Struct("i")


def rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    """``fds`` as the ancillary data that passes them (SCM_RIGHTS)."""
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(map(_INT.pack, fds)))]


def rights_space(count: int) -> int:
    """The ancillary buffer ``count`` passed descriptors need."""
    return _socket.CMSG_SPACE(count * _INT.size)


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors that came in ``ancillary`` (now this process's, to close)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _INT.size
            fds += [fd for (fd,) in _INT.iter_unpack(data[:usable])]
    return fds


def send_frame(sock: _socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = _encode(message).encode("ascii")
    data = _HEADER.pack(len(body)) + body
    if fds:
        sent = sock.sendmsg([data], rights(fds))
        data = data[sent:]
    sock.sendall(data)


def _read_exact(sock: _socket.socket, size: int, deadline: float | None = None) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError("the frame did not arrive in time")
            sock.settimeout(left)
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise WireError("connection closed mid-frame")
        chunks += chunk
    return bytes(chunks)


def _decode(body: bytes) -> dict[str, Any]:
    """What a client sent, read by the daemon (`json` is not on the client's path)."""
    import json

    try:
        message = json.loads(body)
    except ValueError as exc:
        raise WireError(f"bad frame: {exc}") from exc
    if not isinstance(message, dict):
        raise WireError("bad frame: not an object")
    return message


def _flat_object(body: bytes) -> dict[str, int | bool]:
    """A daemon's answer: ``{"name":value,...}`` with lowercase names and integer or
    boolean values, nothing else (no spaces, strings, nesting or repeated names)."""
    text = body.decode("ascii", "strict") if body.isascii() else ""
    if not (text.startswith("{") and text.endswith("}")):
        raise WireError("bad answer: not a flat object")
    out: dict[str, int | bool] = {}
    for item in text[1:-1].split(",") if len(text) > 2 else ():
        name, colon, value = item.partition(":")
        key = name[1:-1]
        if (
            not colon
            or len(name) < 3
            or name[0] != '"'
            or name[-1] != '"'
            or not all("a" <= c <= "z" or c == "_" for c in key)
            or key in out
        ):
            raise WireError(f"bad answer: {item[:40]!r}")
        digits = value[1:] if value.startswith("-") else value
        if value in ("true", "false"):
            out[key] = value == "true"
        elif digits.isdigit() and (digits == "0" or digits[0] != "0"):
            out[key] = int(value)
        else:
            raise WireError(f"bad answer: {item[:40]!r}")
    return out


def _read_frame(sock: _socket.socket) -> bytes | None:
    first = sock.recv(_HEADER.size)
    if not first:
        return None
    head = first + _read_exact(sock, _HEADER.size - len(first))
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes")
    return _read_exact(sock, size)


def recv_frame(sock: _socket.socket) -> dict[str, Any] | None:
    """The next frame a client sent, or None at a clean end of file (the daemon's side)."""
    body = _read_frame(sock)
    return None if body is None else _decode(body)


def recv_answer(sock: _socket.socket) -> dict[str, int | bool] | None:
    """The daemon's next answer, or None at a clean end of file (the client's side)."""
    body = _read_frame(sock)
    return None if body is None else _flat_object(body)


# Linux 6.5+: a pidfd of the sender (SCM_PIDFD, with SO_PASSPIDFD) or of the listener
# (SO_PEERPIDFD). A pid alone names whoever has it when /proc is read, and a confined sender
# that exits can leave its pid to an unconfined process by then.
SO_PASSPIDFD = 76
SO_PEERPIDFD = 77
SCM_PIDFD = 0x04


def recv_request(
    sock: _socket.socket, max_fds: int, deadline: float | None = None
) -> tuple[dict[str, Any], list[int], tuple[int | None, int | None]]:
    """The first frame, the descriptors that came with it, and the process that sent it:
    its pid (SCM_CREDENTIALS: ``sock`` has SO_PASSCRED; None when none came) and a pidfd of
    it (SCM_PIDFD, with SO_PASSPIDFD; None on an older kernel), the caller's to close.
    ``deadline`` (`time.monotonic`): the whole frame by then, however it trickles in."""
    head, ancillary, _, _ = sock.recvmsg(
        _HEADER.size,
        rights_space(max_fds) + _socket.CMSG_SPACE(_UCRED.size) + _socket.CMSG_SPACE(_INT.size),
    )
    fds = received_fds(ancillary)
    sender: int | None = None
    pidfd: int | None = None
    for level, kind, data in ancillary:
        if level != _socket.SOL_SOCKET:
            continue
        if kind == _socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            sender = _UCRED.unpack(data[: _UCRED.size])[0]
        elif kind == SCM_PIDFD and len(data) >= _INT.size:
            pidfd = _INT.unpack(data[: _INT.size])[0]
    try:
        if len(fds) > max_fds:
            raise WireError(f"{len(fds)} descriptors")
        if not head:
            raise WireError("no request")
        head += _read_exact(sock, _HEADER.size - len(head), deadline)
        (size,) = _HEADER.unpack(head)
        if size > MAX_FRAME:
            raise WireError(f"request of {size} bytes")
        return _decode(_read_exact(sock, size, deadline)), fds, (sender, pidfd)
    except BaseException:
        for fd in (*fds, *([pidfd] if pidfd is not None else [])):
            os.close(fd)
        raise


def peer_creds(sock: _socket.socket) -> tuple[int, int]:
    """The pid (0: not in this pid namespace) and uid of the socket's peer."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _ = _UCRED.unpack(creds)
    return int(pid), int(uid)


def peer_uid(sock: _socket.socket) -> int:
    return peer_creds(sock)[1]


SO_PEERGROUPS = 59  # Linux 4.13+; not in Python's `socket`
_MAX_PEER_GROUPS = 256  # what `getsockopt`'s 1024-byte buffer holds: more is ERANGE


def peer_identity(sock: _socket.socket) -> tuple[int, int, tuple[int, ...]] | None:
    """The effective uid and gid and the supplementary groups ``sock``'s peer had when it
    connected (SO_PEERCRED, SO_PEERGROUPS: the kernel's record), or None where the kernel
    cannot say (more groups than a buffer holds, no SO_PEERGROUPS)."""
    try:
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size)
        raw = sock.getsockopt(_socket.SOL_SOCKET, SO_PEERGROUPS, _MAX_PEER_GROUPS * _INT.size)
    except OSError:
        return None
    _, uid, gid = _UCRED.unpack(creds)
    usable = len(raw) - len(raw) % _INT.size
    return uid, gid, tuple(sorted(g for (g,) in _INT.iter_unpack(raw[:usable])))


def own_identity() -> tuple[int, int, tuple[int, ...]]:
    """This process's `peer_identity`, as its peer would read it."""
    return os.geteuid(), os.getegid(), tuple(sorted(os.getgroups()))


def _restrictions(pid: int | str) -> tuple[int, int, int, int]:
    """The mount namespace of ``pid`` and how restricted it is (no_new_privs, seccomp
    filters)."""
    ns = os.stat(f"/proc/{pid}/ns/mnt")
    fields = {"NoNewPrivs": 0, "Seccomp_filters": 0}
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            key, _, value = line.decode(errors="replace").partition(":")
            if key in fields:
                fields[key] = int(value.strip() or 0)
    return ns.st_dev, ns.st_ino, fields["NoNewPrivs"], fields["Seccomp_filters"]


# What a process carries that decides what a command run with it may do, beyond the
# restrictions `unconfined_peer` compares: in its status, every uid and gid (real,
# effective, saved, filesystem), the supplementary groups and the five capability sets;
# its namespaces (a caller in a network namespace of its own must not reach the host's
# network through the daemon) and root directory (a chroot); its cgroup (device rules,
# memory and pids limits) and resource limits; its LSM label (AppArmor, SELinux).
_STATUS_RIGHTS = (b"Uid", b"Gid", b"Groups", b"CapInh", b"CapPrm", b"CapEff", b"CapBnd", b"CapAmb")
_NAMESPACES = ("mnt", "user", "net", "ipc", "uts", "pid", "cgroup", "time")
_PROC_TEXTS = ("limits", "cgroup", "attr/current")
_STATUS_LIMITS = (b"NoNewPrivs", b"Seccomp_filters")  # may be tighter in the peer


def _read_at(proc: int, name: str) -> bytes | None:
    """The whole of ``name`` under the /proc directory ``proc``; None when unreadable (an
    LSM without a label, a file this kernel lacks): compared as such."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    except OSError:
        return None
    try:
        chunks = []
        for _ in range(16):  # a few KiB at most; bounded whatever the kernel does
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _rights(pid: int | str) -> tuple[tuple[object, ...], tuple[int, int]]:
    """What a command run with process ``pid``'s credentials may do (`_STATUS_RIGHTS` and
    the rest above), and its restrictions (no_new_privs, seccomp filters), read through
    one descriptor of its /proc directory: were the process to exit meanwhile, the reads
    fail rather than read whoever takes its pid."""
    proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        status = _read_at(proc, "status")
        if status is None:
            raise OSError(f"no status of {pid}")
        fields = {}
        for line in status.splitlines():
            key, _, value = line.partition(b":")
            fields[key] = value.split()
        rights: list[object] = [fields.get(key) for key in _STATUS_RIGHTS]
        for name in (*(f"ns/{ns}" for ns in _NAMESPACES), "root"):
            try:
                st = os.stat(name, dir_fd=proc)
                rights.append((st.st_dev, st.st_ino))
            except FileNotFoundError:
                rights.append(None)  # a namespace this kernel does not have (time: 5.6+)
        rights += [_read_at(proc, name) for name in _PROC_TEXTS]
        nnp, filters = (int((fields.get(k) or [b"0"])[0]) for k in _STATUS_LIMITS)
        return tuple(rights), (nnp, filters)
    finally:
        os.close(proc)


def holds_own_rights(pid: int | None, pidfd: int | None = None) -> bool:
    """Whether process ``pid`` may have a command run with this process's credentials: it
    holds exactly the same (`_rights`: uids, gids, groups, capabilities, namespaces, root,
    cgroup, rlimits, LSM label) and is as free (no no_new_privs or seccomp filter this
    process lacks, as `unconfined_peer`). A caller with other rights (no group `adm`, fewer
    capabilities, a network namespace of its own) is not served with this process's: it
    runs fresh, with its own."""
    if not pid or pid < 0:
        return False
    try:
        theirs, (nnp, filters) = _rights(pid)
        ours, (own_nnp, own_filters) = _rights("self")
    except (OSError, ValueError, IndexError):
        return False
    # Read from /proc first, then the pidfd checked (as `unconfined_peer`).
    if pidfd is not None and not pidfd_names(pidfd, pid):
        return False
    return theirs == ours and nnp <= own_nnp and filters <= own_filters


def pidfd_names(pidfd: int, pid: int) -> bool:
    """Whether ``pidfd`` still refers to the live process ``pid`` (its fdinfo's `Pid:`; -1
    once that process is gone, so a pid reused since never matches)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError, IndexError):
        return False
    return False


def peer_pidfd(sock: _socket.socket) -> int | None:
    """A pidfd of the process that made ``sock``'s peer (a listener: whoever called
    `listen`), or None on a kernel without SO_PEERPIDFD."""
    try:
        (pidfd,) = _INT.unpack(sock.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD, _INT.size))
        return int(pidfd)
    except OSError:
        return None


def unconfined_peer(pid: int | None, pidfd: int | None = None) -> bool:
    """Whether process ``pid`` is as free as this one: the same mount namespace, and not
    no_new_privs or more seccomp filters where this process is not. A confined command
    never is (its own mount namespace, or, under Landlock alone, no_new_privs and the
    sandbox's filters): a socket in a directory some command can write (another TMPDIR's
    private directory inside a writable root) must not let it reach an unconfined daemon,
    nor let it pose as one."""
    if not pid or pid < 0:
        return False
    try:
        dev, ino, nnp, filters = _restrictions(pid)
        own_dev, own_ino, own_nnp, own_filters = _restrictions("self")
    except (OSError, ValueError):
        return False
    # Read from /proc first, then the pidfd checked: alive and the same pid after the reads,
    # so what they read was that process's (a pid is not reused while its process lives).
    if pidfd is not None and not pidfd_names(pidfd, pid):
        return False
    return (dev, ino) == (own_dev, own_ino) and nnp <= own_nnp and filters <= own_filters
