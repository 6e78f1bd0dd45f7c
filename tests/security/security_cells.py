"""What a security test is parametrised by (the backend gate is `tests.sandbox.conftest`'s)."""

from __future__ import annotations

from dataclasses import dataclass

# The backend gate (skip locally, fail in CI) is the one the sandbox tests use.


@dataclass(frozen=True)
class Cell:
    """One attack on one backend in one mode (the parameter of the security tests)."""

    attack_id: str
    backend: str
    mode: str

    def __str__(self) -> str:
        return f"{self.attack_id}-{self.backend}-{self.mode}"
