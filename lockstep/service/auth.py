"""Bearer-token authentication with two roles: ``admin`` (everything) and ``read``.

The token file holds one ``ROLE TOKEN`` per line (``#`` comments allowed). Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import enum
import hmac
from pathlib import Path

from lockstep.errors import ConfigurationError


class Role(str, enum.Enum):
    ADMIN = "admin"
    READ = "read"


def load_tokens(path: Path) -> dict[str, Role]:
    """Parse a token file; raise ConfigurationError naming the bad line (not the token)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigurationError(f"cannot read token file {path}: {e.strerror}") from e
    tokens: dict[str, Role] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2 or parts[0] not in {r.value for r in Role}:
            raise ConfigurationError(
                f"{path}:{number}: expected 'ROLE TOKEN' with ROLE admin or read"
            )
        tokens[parts[1]] = Role(parts[0])
    if not tokens:
        raise ConfigurationError(f"token file {path} holds no tokens")
    return tokens


def role_of(tokens: dict[str, Role], presented: str) -> Role | None:
    """The role of a presented token (constant-time comparison against every token)."""
    found = None
    for token, role in tokens.items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = role
    return found
