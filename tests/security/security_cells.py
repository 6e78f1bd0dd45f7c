"""What a security test is parametrised by, and the backend gate shared by every test here."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import pytest

from bash_sandbox.backends.base import BackendProbe
from bash_sandbox.selection import candidate_backends


@dataclass(frozen=True)
class Cell:
    """One attack on one backend in one mode (the parameter of the security tests)."""

    attack_id: str
    backend: str
    mode: str

    def __str__(self) -> str:
        return f"{self.attack_id}-{self.backend}-{self.mode}"


@functools.cache
def probe(backend: str) -> BackendProbe:
    return candidate_backends(backend)[0].probe(10_000)


def require_backend(name: str) -> None:
    """Skip an unusable backend locally; fail it in CI, where every backend must work."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the Linux backends need Linux")
    result = probe(name)
    if not result.usable:
        if os.environ.get("CI"):
            pytest.fail(f"{name} must be usable in CI: {result.detail}")
        pytest.skip(f"{name} unusable here: {result.detail}")
