"""Egress by allowlist: the HTTP proxy that is a confined command's only way out of its
network namespace, its grants, resolver, address rules and the variables tools read."""

from bash_sandbox.egress.admission import EgressDenial, EgressDenialCode
from bash_sandbox.egress.environment import proxy_environment
from bash_sandbox.egress.grants import ProxyGrant
from bash_sandbox.egress.limits import ProxyLimits
from bash_sandbox.egress.proxy import EgressProxy, EgressProxyError
from bash_sandbox.egress.resolver import (
    Resolution,
    ResolutionError,
    Resolver,
    StaticResolver,
    SystemResolver,
)

__all__ = [
    "EgressDenial",
    "EgressDenialCode",
    "EgressProxy",
    "EgressProxyError",
    "ProxyGrant",
    "ProxyLimits",
    "Resolution",
    "ResolutionError",
    "Resolver",
    "StaticResolver",
    "SystemResolver",
    "proxy_environment",
]
