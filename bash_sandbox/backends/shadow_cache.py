"""Reuse of the host survey behind the shadows while nothing it read has changed.

A survey (`mount_plan.survey_shadows`) resolves every denied name and lists each directory
holding one: a few milliseconds for the default list, on every spawn. It depends only on
what it looked at, so it is kept with a stamp of each thing, and reused while every stamp
is the same:

- each path it resolved (every component of every denied name, through every link): its
  identity (device, inode, type), which changes when a component is created, removed,
  renamed over or replaced by a link;
- each directory it listed: its identity and times. A listed directory changed in the last
  two seconds is never trusted (its mtime comes from the kernel's coarse clock, so two changes
  within one tick look alike, as in git's "racy clean" rule): the survey of a directory that
  keeps changing is simply redone each time.

What a stale survey could get wrong is only what a shadow lists: a sibling made since stays
hidden (the command sees the directory as it was), a denied name made since has no entry, so
it is hidden too. The names covered where they lie (system directories, large directories,
inside the roots) are looked at on every spawn, cached survey or not (`cover_candidates`).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable

from bash_sandbox.backends.mount_plan import (
    Shadow,
    ShadowSurvey,
    cover_candidates,
    survey_shadows,
)
from policies import stamps

# Directories changed this recently are surveyed again rather than trusted.
SETTLE_NS = stamps.SETTLE_NS

Stamp = tuple[int, ...] | None


def _identity(path: str) -> Stamp:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode)


def _links(survey: ShadowSurvey, stamps: tuple[Stamp, ...]) -> tuple[str, ...]:
    """The resolved paths that are symbolic links (each stamp's third field is the mode)."""
    return tuple(
        path
        for path, st in zip(survey.resolved, stamps, strict=False)
        if st is not None and stat.S_ISLNK(st[2])
    )


def _stamps(survey: ShadowSurvey) -> tuple[Stamp, ...]:
    # A listed directory: its identity, size and times (`policies/stamps.py`).
    return (*map(_identity, survey.resolved), *map(stamps.stamp, survey.listed))


_Key = tuple[tuple[str, ...], tuple[str, ...]]
# A survey every cache made later in this process starts from (`seed`); None: none.
_seeded: tuple[_Key, ShadowSurvey, tuple[Stamp, ...]] | None = None


def seed(denied: Iterable[str], roots: tuple[str, ...], settle_ns: int = SETTLE_NS) -> bool:
    """Survey now, and let each `ShadowCache` made later in this process start from it.

    For the warm CLI's daemon, before it forks a fresh executor per call: the read-only
    survey of the default `deny_read` is the same for every call, and each fork still
    checks every stamp before it uses it, as an executor does between its own commands
    (a change since, or a key of another call's policy, is surveyed afresh). False when
    nothing was kept (a directory changed within the settle window)."""
    global _seeded  # noqa: PLW0603 (set once, before the forks that read it)
    cache = ShadowCache(settle_ns)
    cache.inspect(denied, roots)
    if cache._key is None or cache._survey is None:
        _seeded = None
        return False
    _seeded = (cache._key, cache._survey, cache._stamps)
    return True


class ShadowCache:
    """One executor's last survey, with the stamps of the directories it read."""

    def __init__(self, settle_ns: int = SETTLE_NS) -> None:
        self._settle_ns = settle_ns
        self._lock = threading.Lock()
        self._key: _Key | None = None
        self._survey: ShadowSurvey | None = None
        self._stamps: tuple[Stamp, ...] = ()
        if _seeded is not None:
            self._key, self._survey, self._stamps = _seeded
        self.hits = 0  # surveys reused (tests and the bench read it)
        # The symbolic links on the way to the denied names, as the last `inspect` found them.
        self.links: tuple[str, ...] = ()
        # The names the last `inspect` covers where they lie, existing or not (`survey_shadows`).
        self.candidates: tuple[str, ...] = ()

    def inspect(
        self, denied: Iterable[str], roots: tuple[str, ...]
    ) -> tuple[tuple[Shadow, ...], tuple[str, ...], tuple[str, ...]]:
        """`mount_plan.inspect_shadows`, from the last survey when it still holds."""
        key = (tuple(denied), roots)
        with self._lock:
            survey = self._survey
            if key == self._key and survey is not None and self._unchanged(survey):
                self.hits += 1
                self.links = _links(survey, self._stamps)
                self.candidates = survey.candidates
                return cover_candidates(survey)
        survey = survey_shadows(key[0], roots)
        # Stamped after the survey: a listing changed in between is recent, so never kept;
        # a path replaced in between has a new identity at once, so the next call redoes it.
        stamps = _stamps(survey)
        self.links = _links(survey, stamps)
        self.candidates = survey.candidates
        with self._lock:
            if self._settled(survey, stamps):
                self._key, self._survey, self._stamps = key, survey, stamps
            else:
                self._key, self._survey, self._stamps = None, None, ()
        return cover_candidates(survey)

    def _unchanged(self, survey: ShadowSurvey) -> bool:
        return _stamps(survey) == self._stamps

    def _settled(self, survey: ShadowSurvey, stamps: tuple[Stamp, ...]) -> bool:
        horizon = time.time_ns() - self._settle_ns
        listings = stamps[len(survey.resolved) :]
        # The mtime is what an entry change moves (the ctime moves with it, and with chmod).
        return all(s is None or s[3] < horizon for s in listings)
