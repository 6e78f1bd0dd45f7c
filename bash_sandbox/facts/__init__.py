"""Denial facts and hints: what a confined command was refused, and what it points at.

A denial rests on evidence the command cannot forge (the seccomp supervisor, the git
overlay, the egress proxy, kernel records); those sources live with the executor.
`inference` reads file refusals out of the output and checks them against the policy
(`dialects` knows how tools print them), `network_hints` finds loopback destinations the
host serves and the names behind a refused lookup: all of these are *hints*, never
denials. `summary` bounds and groups the lists, `flags` turns denials into the result's
`denied`/`network_denied`, `markers` renders the lines. Everything here is pure except
`network_hints.host_tcp_listeners`, which reads /proc.
"""

from bash_sandbox.facts.dialects import RefusalMessage, find_refusal_messages
from bash_sandbox.facts.flags import (
    DENIALS_LIMIT,
    bounded_denials,
    derive_facts_flags,
    failed_on_its_own,
)
from bash_sandbox.facts.inference import infer_file_hints
from bash_sandbox.facts.markers import (
    denial_marker,
    git_outcome_text,
    group_marker,
    hint_marker,
    result_markers,
)
from bash_sandbox.facts.network_hints import (
    host_tcp_listeners,
    loopback_destinations,
    loopback_hints,
    requested_names,
    resolve_hints,
)
from bash_sandbox.facts.summary import FactsLists, collect_hints, group_denials, summarize

__all__ = [
    "DENIALS_LIMIT",
    "FactsLists",
    "RefusalMessage",
    "bounded_denials",
    "collect_hints",
    "denial_marker",
    "derive_facts_flags",
    "failed_on_its_own",
    "find_refusal_messages",
    "git_outcome_text",
    "group_denials",
    "group_marker",
    "hint_marker",
    "host_tcp_listeners",
    "infer_file_hints",
    "loopback_destinations",
    "loopback_hints",
    "requested_names",
    "resolve_hints",
    "result_markers",
    "summarize",
]
