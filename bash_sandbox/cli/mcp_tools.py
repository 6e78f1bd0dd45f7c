"""The MCP server's tools as the model sees them: names, descriptions, argument schemas.

Each tool's arguments are a pydantic model (validated strictly: a string where an integer
belongs is refused, never coerced); its `inputSchema` is that model's JSON schema, with the
escalation fields (`sandbox_mode`, `network`) shown only when the server's ceiling lets a call
widen (`EscalationCeiling.offers_mode` / `offers_network`) and then limited to what it allows.
"""

from __future__ import annotations

from typing import Annotated, Any

import mcp_types as types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, SkipJsonSchema
from pydantic_core import core_schema

from bash_sandbox.cli.mcp_escalation import EscalationCeiling
from policies import NetworkMode, SandboxMode
from policies.units import duration_or_text

BASH_RUN = "bash_run"
BASH_START = "bash_start"
BASH_READ = "bash_read"
BASH_KILL = "bash_kill"
BASH_LIST = "bash_list"

Command = Annotated[StrictStr, Field(min_length=1, description="The bash script to run (bash -c).")]
Workdir = Annotated[
    StrictStr,
    Field(
        description="Working directory; a relative path is taken from the workspace root "
        "(default: the workspace root)."
    ),
]
ProcessId = Annotated[StrictStr, Field(min_length=1, description="The id bash_start returned.")]
# Validated as plain strings: an unknown value gets the enums' own one-line error, and the
# schema's enum is narrowed to the ceiling (see `tool_definitions`).
ModeName = StrictStr
NetworkName = StrictStr


class _ArgumentsModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BashRunArguments(_ArgumentsModel):
    command: Command
    workdir: Workdir | SkipJsonSchema[None] = None
    timeout_ms: (
        Annotated[
            StrictInt,
            Field(gt=0, description="Kill the command after this many milliseconds."),
            # The CLI's units grammar too (`30s`), for a model that writes it so.
            BeforeValidator(duration_or_text),
        ]
        | SkipJsonSchema[None]
    ) = None
    sandbox_mode: ModeName | SkipJsonSchema[None] = None
    network: NetworkName | SkipJsonSchema[None] = None


Port = Annotated[StrictInt, Field(ge=1, le=65535)]


class BashStartArguments(_ArgumentsModel):
    command: Command
    workdir: Workdir | SkipJsonSchema[None] = None
    publish: (
        Annotated[
            list[Port],
            Field(
                max_length=16,
                description="Ports the command will listen on (127.0.0.1 inside the sandbox) "
                "to make reachable from the host, e.g. a dev server; the result gives each "
                "one's host URL, open until the command ends.",
            ),
        ]
        | SkipJsonSchema[None]
    ) = None
    sandbox_mode: ModeName | SkipJsonSchema[None] = None
    network: NetworkName | SkipJsonSchema[None] = None


class ProcessArguments(_ArgumentsModel):
    id: ProcessId


class NoArguments(_ArgumentsModel):
    pass


ARGUMENT_MODELS: dict[str, type[_ArgumentsModel]] = {
    BASH_RUN: BashRunArguments,
    BASH_START: BashStartArguments,
    BASH_READ: ProcessArguments,
    BASH_KILL: ProcessArguments,
    BASH_LIST: NoArguments,
}


class _ToolSchema(GenerateJsonSchema):
    """Drops the `"default": null` of optional fields: leaving them out says the same."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        result = super().default_schema(schema)
        if result.get("default", ...) is None:
            result.pop("default")
        return result


def _input_schema(
    model: type[_ArgumentsModel],
    ceiling: EscalationCeiling,
    default_mode: SandboxMode,
    default_network: NetworkMode,
) -> dict[str, Any]:
    schema = model.model_json_schema(schema_generator=_ToolSchema)
    schema.pop("title", None)
    properties: dict[str, Any] = schema.get("properties", {})
    for prop in properties.values():
        prop.pop("title", None)
    if "sandbox_mode" in properties:
        if ceiling.offers_mode(default_mode):
            modes = [m.value for m in ceiling.modes_offered(default_mode)]
            properties["sandbox_mode"] = {
                "type": "string",
                "enum": modes,
                "description": f"Run this one call under a wider sandbox mode than the "
                f"default ({default_mode.value}), when the task needs it. The user is asked "
                "to approve first; without approval nothing runs. Ask only after a command "
                "was denied by the sandbox.",
            }
        else:
            del properties["sandbox_mode"]
    if "network" in properties:
        if ceiling.offers_network(default_network):
            properties["network"] = {
                "type": "string",
                "enum": [n.value for n in NetworkMode],
                "description": "host: give this one call the host's network (the default, "
                "isolated, has only the sandbox's own loopback). The user is asked to "
                "approve first.",
            }
        else:
            del properties["network"]
    return schema


_QUOTED = (
    "Each line of the command's output is indented by two spaces; the lines that start at "
    "the first column ([exit N], [stderr], [sandbox: ...]) are this server's own."
)


def _description(name: str, default_mode: SandboxMode, network: NetworkMode) -> str:
    if default_mode is SandboxMode.DANGER_FULL_ACCESS:
        where = "Commands run unconfined (sandbox mode danger-full-access)."
    else:
        where = (
            f"Commands run confined (sandbox mode {default_mode.value}, network "
            f"{network.value}) in one long-lived sandbox: they share its private /tmp, tool "
            "caches and loopback, so a server started with bash_start is reachable from "
            "later calls."
        )
    texts = {
        BASH_RUN: "Run a bash command and wait for it. Returns its exit status, its output "
        "(the tail when it is long) and what the sandbox did; a command the sandbox refused "
        "reports the denial. " + _QUOTED + " " + where,
        BASH_START: "Start a bash command in the background (a server, a watcher) and return "
        "its id at once; read its output with bash_read, stop it with bash_kill. It lives "
        "until it exits, is killed, or this server stops. " + where,
        BASH_READ: "The new output of a background command since the last bash_read (each "
        "byte is returned once), and whether it is still running. " + _QUOTED,
        BASH_KILL: "Kill a background command (its whole process group) and wait for it to end.",
        BASH_LIST: "List the background commands of this server with their status.",
    }
    return texts[name]


def tool_definitions(
    ceiling: EscalationCeiling, default_mode: SandboxMode, default_network: NetworkMode
) -> list[types.Tool]:
    """The tool list for `tools/list`, shaped by the server's ceiling."""
    read_only = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    runs = types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=default_mode is not SandboxMode.READ_ONLY,
        open_world_hint=default_network is NetworkMode.HOST
        or ceiling.offers_network(default_network),
    )
    annotations = {
        BASH_RUN: runs,
        BASH_START: runs,
        BASH_READ: read_only,
        BASH_KILL: types.ToolAnnotations(read_only_hint=False, open_world_hint=False),
        BASH_LIST: read_only,
    }
    return [
        types.Tool(
            name=name,
            description=_description(name, default_mode, default_network),
            input_schema=_input_schema(model, ceiling, default_mode, default_network),
            annotations=annotations[name],
        )
        for name, model in ARGUMENT_MODELS.items()
    ]
