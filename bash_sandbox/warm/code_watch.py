"""Whether the warm daemon's code changed on disk since it loaded it.

A daemon that serves a call with code older than the files it came from would answer as no
fresh process can (`daemon.py` retires instead). Stating every loaded module of the package
(about 190 files) on every call cost 0.6 ms of each; an inotify watch on their directories
tells the same thing for one empty read. An event that names a loaded file (a write, a
rename over it, its removal, a change of its attributes) makes the daemon stale; other names
in those directories (an editor's swap file, `__pycache__`) do not. Where the watch is not
to be had (no inotify, the user's limits) or lost events (a queue overflow), every file's
modification time is compared with the one loaded, as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from collections.abc import Iterable

from bash_sandbox.linux import inotify

_PREFIXES = ("bash_sandbox", "bash_local", "bash_seam", "policies")
# What replaces or edits a file: an editor's write, a rename over it, an install's new file.
_MASK = inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.NAME_CHANGES | inotify.SELF_CHANGES


class CodeWatch:
    """The package's loaded modules and the modification times they were loaded with."""

    def __init__(self, files: Iterable[str] | None = None) -> None:
        """``files``: the files to watch; None: every loaded module of the package."""
        if files is None:
            files = [
                path
                for name, module in list(sys.modules.items())
                if (path := getattr(module, "__file__", None)) and name.split(".")[0] in _PREFIXES
            ]
        self._mtimes: dict[str, int] = {}
        for path in files:
            with contextlib.suppress(OSError):
                self._mtimes[path] = os.stat(path).st_mtime_ns
        self._names: dict[int, set[str]] = {}  # watch -> the loaded files' names there
        self._watch: inotify.Inotify | None = None
        self._stale = False
        by_dir: dict[str, set[str]] = defaultdict(set)
        for path in self._mtimes:
            by_dir[os.path.dirname(path)].add(os.path.basename(path))
        try:
            watch = inotify.Inotify()
        except inotify.InotifyError:
            return
        try:
            for directory, names in by_dir.items():
                self._names[watch.add_watch(directory, _MASK | inotify.IN_ONLYDIR)] = names
        except inotify.InotifyError:
            watch.close()
            self._names.clear()
            return
        self._watch = watch
        # Anything changed between the import and the watch: compared once, now.
        self._stale = self._changed_on_disk()

    def changed(self) -> bool:
        """Whether any loaded module's file changed (sticky: a changed daemon stays so)."""
        if self._watch is None:
            return self._changed_on_disk()
        if self._stale:
            return True
        try:
            events = self._watch.read_events()
        except inotify.InotifyError:
            events = [inotify.Event(-1, inotify.IN_Q_OVERFLOW, "")]
        for event in events:
            names = self._names.get(event.wd)
            if event.mask & inotify.IN_Q_OVERFLOW:
                self._stale = self._changed_on_disk()  # events were lost
            elif names is None or event.mask & (inotify.SELF_CHANGES | inotify.IN_IGNORED):
                self._stale = True  # a directory of the code moved or went
            elif event.name in names:
                self._stale = True
            if self._stale:
                break
        return self._stale

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def _changed_on_disk(self) -> bool:
        for path, mtime in self._mtimes.items():
            try:
                if os.stat(path).st_mtime_ns != mtime:
                    return True
            except OSError:
                return True
        return False
