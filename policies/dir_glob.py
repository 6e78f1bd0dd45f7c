"""Glob expansion of the default `deny_read` patterns, reused while their directory holds.

Every policy is built afresh per call, and so is its `deny_read`: the patterns with a `*`
(`~/.aider*`, `/etc/ssh/ssh_host_*_key`) list their directory each time. The `*` is only
ever in the last component, so the answer depends on that one directory's names alone: it
is kept with the directory's stamp (`stamps.py`) and reused while it is the same and
settled.
"""

from __future__ import annotations

import glob
import os
import threading

from policies import stamps

SETTLE_NS = stamps.SETTLE_NS  # here, so the tests can shorten it
_MAX_KEPT = 64

_lock = threading.Lock()
_kept: dict[str, tuple[stamps.Stamp, tuple[str, ...]]] = {}


def expand(pattern: str) -> tuple[str, ...]:
    """``pattern``'s matches, sorted, hidden names included (the default patterns name
    dotfiles on purpose); the pattern itself when it has no `*`."""
    if "*" not in pattern:
        return (pattern,)
    directory = os.path.dirname(pattern)
    if "*" in directory:  # not one directory's names: no stamp can stand for it
        return tuple(sorted(glob.glob(pattern, include_hidden=True)))
    # Stamped before the listing: a change in between moves the stamp, so the next call
    # lists again rather than trusting what this one saw.
    stamp = stamps.stamp(directory)
    with _lock:
        kept = _kept.get(pattern)
    if stamp is not None and kept is not None and kept[0] == stamp:
        return kept[1]
    matches = tuple(sorted(glob.glob(pattern, include_hidden=True)))
    if stamp is not None and stamps.settled((stamp,), SETTLE_NS):
        with _lock:
            if len(_kept) >= _MAX_KEPT:
                _kept.clear()
            _kept[pattern] = (stamp, matches)
    return matches
