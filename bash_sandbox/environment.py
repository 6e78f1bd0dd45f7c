"""The environment a confined command inherits: an allowlist, never the executor's secrets.

(Provisional minimal allowlist; the full list and its reasons land with the policy work.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

INHERITED_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM"}
)
INHERITED_PREFIXES = ("LC_",)
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def sandbox_inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` a confined command inherits."""
    return {
        name: value
        for name, value in environ.items()
        if (name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES))
        and not _USERINFO.match(value)
    }
