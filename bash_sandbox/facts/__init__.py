"""Denial facts: what a confined command was refused, from evidence or, failing that, its output.

`inference` reads file refusals out of the output and checks them against the policy
(`dialects` knows how tools print them), `flags` turns denials into the result's
`denied`/`network_denied` and bounds the list, `markers` renders one line per denial.
Everything here is pure; the evidence sources (seccomp supervisor, git overlay, egress
proxy) live with the executor.
"""

from bash_sandbox.facts.dialects import RefusalMessage, find_refusal_messages
from bash_sandbox.facts.flags import (
    DENIALS_LIMIT,
    bounded_denials,
    derive_facts_flags,
    failed_on_its_own,
)
from bash_sandbox.facts.inference import infer_file_denials
from bash_sandbox.facts.markers import denial_marker, result_markers

__all__ = [
    "DENIALS_LIMIT",
    "RefusalMessage",
    "bounded_denials",
    "denial_marker",
    "derive_facts_flags",
    "failed_on_its_own",
    "find_refusal_messages",
    "infer_file_denials",
    "result_markers",
]
