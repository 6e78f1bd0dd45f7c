"""The attack catalog: every row of threat-model.md as real attacks, plus positive controls.

One source of truth: `bash-sandbox audit` and tests/security both run `ATTACKS`, built here
in row order (the positive controls of row 0 first) from one module per threat-model row.
Each attack names its row, builds its premise under its own directory (`prepare`), and is
judged from outside the sandbox (`verify`): the host tree compared before and after, victim
processes the audit started, servers the audit bound, processes found by the run's token.
A command's own words count only as extra evidence of success ("ESCAPE ..." lines printed
when a forbidden call returned success), never as proof of containment.

Harmless by construction: targets are the audit's own files, processes, sockets and
servers on 127.0.0.1/::1. Device and kernel knobs are only opened for writing (then closed,
nothing written) or written with the value they already hold.
"""

from __future__ import annotations

from bash_sandbox_audit.attacks import (
    controls,
    row01_files,
    row02_links,
    row03_devices,
    row04_protected,
    row05_secrets,
    row06_signals,
    row07_processes,
    row08_privilege,
    row09_terminals,
    row10_sockets,
    row11_lifetime,
    row12_output,
    row13_executor_secrets,
    row14_helpers,
    row15_trust,
    row16_git,
    row16_git_import,
    row18_terminal,
    row19_setid,
    row20_shared_state,
    row21_git_import,
)
from bash_sandbox_audit.model import Attack

# Row order: the general positive controls (row 0) first, then each row's attacks followed
# by that row's own controls.
_ROWS = (
    row01_files,
    row02_links,
    row03_devices,
    row04_protected,
    row05_secrets,
    row06_signals,
    row07_processes,
    row08_privilege,
    row09_terminals,
    row10_sockets,
    row11_lifetime,
    row12_output,
    row13_executor_secrets,
    row14_helpers,
    row15_trust,
    row16_git,
    row16_git_import,
    row18_terminal,
    row19_setid,
    row20_shared_state,
    row21_git_import,
)
ATTACKS: tuple[Attack, ...] = (
    *controls.ATTACKS,
    *(entry for row in _ROWS for entry in (*row.ATTACKS, *getattr(row, "CONTROLS", ()))),
)


def by_id(attack_id: str) -> Attack:
    for a in ATTACKS:
        if a.id == attack_id:
            return a
    raise KeyError(attack_id)


__all__ = ["ATTACKS", "by_id"]
