"""What ``lockstep serve`` says when it starts: where each part of the service answers, who
may call it, over which store (never a secret), and the limits it runs with."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.service.auth import Grant
    from lockstep.service.connections import ConnectionLimits
    from lockstep.service.settings import ServiceSettings

_PASSWORD = re.compile(r"(://[^/:@\s]*):[^@/\s]*@")
_SECRET_OPTION = re.compile(r"([?&][^=&]*(?:password|secret|token|key)[^=&]*=)[^&]*", re.I)


def redacted_url(url: str) -> str:
    """``url`` with its password and secret-looking query options hidden.

    >>> redacted_url("postgresql://etl:pw@db/lockstep?sslpassword=x&sslmode=require")
    'postgresql://etl:***@db/lockstep?sslpassword=***&sslmode=require'
    """
    return _SECRET_OPTION.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine would use (an IPv6 address in brackets).

    >>> base_url("::1", 8765), base_url("127.0.0.1", 80)
    ('http://[::1]:8765', 'http://127.0.0.1:80')
    """
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    return f"http://{f'[{host}]' if bracketed else host}:{port}"


def banner(
    settings: ServiceSettings, tokens: Mapping[str, Grant] | None, limits: ConnectionLimits
) -> str:
    """The lines printed at start (see the module's docstring)."""
    base = base_url(settings.host, settings.port)
    everywhere = settings.host in ("0.0.0.0", "::")
    rows = [
        ("API", f"{base}/v1/... (OpenAPI: {base}/openapi.json)"),
        ("status page", f"{base}/" + ("?token=TOKEN" if tokens is not None else "")),
    ]
    if settings.iceberg is not None:
        rows.append(
            (
                "Iceberg REST",
                f"{base}/iceberg (warehouse {redacted_url(settings.iceberg.warehouse)}, "
                f"publish {settings.iceberg.publish})",
            )
        )
    rows += [
        ("metrics", f"{base}/metrics"),
        ("health", _health(settings, base)),
        ("auth", _auth(settings, tokens)),
        ("store", redacted_url(settings.store)),
    ]
    if settings.catalog is not None:
        from lockstep.barrier.iceberg.catalog import IcebergCatalog

        rows.append(("catalog", f"{IcebergCatalog.from_mapping(settings.catalog).describe()}"))
    policy = settings.issue_policy()
    rows += [
        (
            "barriers",
            f"issued {policy.describe()} (by one replica at a time)"
            if policy is not None
            else "none issued here (lockstep barrier issue --every S, or --barrier-interval S)",
        ),
        (
            "connections",
            f"at most {limits.max_connections} open; a request must arrive within "
            f"{limits.read_timeout_s:g} s",
        ),
        ("access log", "on" if settings.access_log else "off (--access-log: a line a request)"),
    ]
    if settings.workers > 1:
        rows.append(("workers", f"{settings.workers} processes, each a replica"))
    head = f"Lockstep coordinator on {base}" + (" (every interface)" if everywhere else "")
    width = max(len(name) for name, _ in rows)
    return "\n".join([head, *(f"  {name:<{width}}  {what}" for name, what in rows)])


def _health(settings: ServiceSettings, base: str) -> str:
    if settings.health_port is None:
        return f"{base}/healthz"
    own = base_url(settings.host, settings.health_port)
    return f"{base}/healthz, and {own}/healthz for liveness probes (a process of its own)"


def _auth(settings: ServiceSettings, tokens: Mapping[str, Grant] | None) -> str:
    if tokens is None:
        hosts = ", ".join(settings.allowed_hosts)
        return (
            "no token file: loopback callers only"
            + (f" (and hosts {hosts})" if hosts else "")
            + ", each an admin (development only)"
        )
    roles = Counter(grant.role.value for grant in tokens.values())
    said = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    return f"token file {settings.token_file} ({said} token{'s' if len(tokens) > 1 else ''})"
