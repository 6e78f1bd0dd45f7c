"""Unconfined local execution: `LocalBashExecutor` runs each command as a fresh `bash -c`."""

from bash_local.config import LocalBashConfig
from bash_local.environment import build_command_env
from bash_local.executor import ExecutorClosedError, LocalBashExecutor
from bash_local.output import OutputCollector, OutputListener, PacedListener, SpillDirectory
from bash_local.process import LocalBashProcess, SpawnedCommand
from bash_local.spawn import (
    SpawnOutcome,
    SpawnPlan,
    SpawnScope,
    UnconfinedSpawn,
    folded_signal,
)

__all__ = [
    "ExecutorClosedError",
    "LocalBashConfig",
    "LocalBashExecutor",
    "LocalBashProcess",
    "OutputCollector",
    "OutputListener",
    "PacedListener",
    "SpawnOutcome",
    "SpawnPlan",
    "SpawnScope",
    "SpawnedCommand",
    "SpillDirectory",
    "UnconfinedSpawn",
    "build_command_env",
    "folded_signal",
]
