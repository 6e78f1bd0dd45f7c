"""Host placeholders for protected names that do not exist yet, and who still needs them.

A protected name inside a writable root (say `deploy/secrets.env`) that is missing when a
command starts must stay uncreatable for as long as the command lives, and a cover mount
needs something to sit on. So the executor creates a placeholder of the right kind (an empty
file, or an empty directory for names written with a trailing `/`), covers it read-only, and
removes it again once no running command of any executor of this uid needs it, and only
while it is still an untouched placeholder. The ledger (one JSON file under this uid's base,
locked with flock) records who holds each placeholder: removing one that another executor's
command still sits on would detach that command's cover.

Holders are `pid:starttime` of the executor process, so a holder that died (SIGKILL, a
crash) is recognised and dropped the next time the ledger is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator

from bash_local.userdir import user_base_dir

_LEDGER = "placeholders.json"


def _process_id(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            start = fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        start = "?"
    return f"{pid}:{start}"


def _alive(holder: str) -> bool:
    pid, _, _ = holder.partition(":")
    return pid.isdigit() and _process_id(int(pid)) == holder


@contextlib.contextmanager
def _ledger() -> Iterator[dict[str, dict[str, object]]]:
    path = os.path.join(user_base_dir(), _LEDGER)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 1 << 20, 0)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        yield data
        encoded = json.dumps(data).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, encoded, 0)
    finally:
        os.close(fd)


def _holders(entry: dict[str, object]) -> list[str]:
    """The entry's holders that are still alive."""
    raw = entry.get("holders")
    listed = raw if isinstance(raw, list) else []
    return [h for h in listed if isinstance(h, str) and _alive(h)]


def _is_placeholder(path: str, is_dir: bool) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if is_dir:
        return stat.S_ISDIR(st.st_mode) and not os.listdir(path)
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


class Placeholders:
    """The placeholders one executor holds (released per spawn, all of them at close)."""

    def __init__(self) -> None:
        self._me = _process_id(os.getpid())

    def acquire(self, path: str, is_dir: bool) -> bool:
        """Make ``path`` exist as an empty placeholder (or find it made) and hold it.

        False when something else appeared there meanwhile (then it is not ours to cover
        as a placeholder: it is an ordinary existing name)."""
        with _ledger() as ledger:
            entry = ledger.get(path)
            if entry is None:
                if os.path.lexists(path):
                    return False
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if is_dir:
                    os.mkdir(path, 0o755)
                else:
                    os.close(
                        os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
                    )
                entry = {"dir": is_dir, "holders": []}
                ledger[path] = entry
            holders = _holders(entry)
            holders.append(self._me)
            entry["holders"] = holders
            return True

    def release(self, path: str) -> None:
        """Stop holding ``path``; remove it when nobody does and it is still untouched."""
        with _ledger() as ledger:
            entry = ledger.get(path)
            if entry is None:
                return
            holders = _holders(entry)
            if self._me in holders:
                holders.remove(self._me)
            entry["holders"] = holders
            if holders:
                return
            del ledger[path]
            is_dir = bool(entry.get("dir"))
            if _is_placeholder(path, is_dir):
                with contextlib.suppress(OSError):
                    (os.rmdir if is_dir else os.unlink)(path)
