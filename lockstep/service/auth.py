"""Bearer-token authentication with two roles: ``admin`` (everything) and ``read``.

The token file holds one ``ROLE TOKEN`` per line (``#`` comments allowed). Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import enum
import hmac
import logging
import stat
from pathlib import Path

from lockstep.errors import ConfigurationError

log = logging.getLogger("lockstep.service")


class Role(str, enum.Enum):
    ADMIN = "admin"
    READ = "read"


MIN_TOKEN_LENGTH = 16


def load_tokens(path: Path) -> dict[str, Role]:
    """Parse a token file; raise ConfigurationError naming the bad line (never the token).

    Refused: a line that is not ``ROLE TOKEN``, a token shorter than 16 characters, a token
    listed twice, a file that is not UTF-8. A file other users may read gets a warning.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"cannot read token file {path}: {e.strerror}") from e
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ConfigurationError(
            f"token file {path} is not UTF-8 text (byte {e.start}): write it as UTF-8"
        ) from None
    _warn_if_readable(path)
    tokens: dict[str, Role] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2 or parts[0] not in {r.value for r in Role}:
            raise ConfigurationError(
                f"{path}:{number}: expected 'ROLE TOKEN' with ROLE admin or read"
            )
        role, token = Role(parts[0]), parts[1]
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"{path}:{number}: the token is shorter than {MIN_TOKEN_LENGTH} characters; "
                "use a random one (python -c 'import secrets; print(secrets.token_urlsafe())')"
            )
        if token in tokens:
            raise ConfigurationError(
                f"{path}:{number}: this token is already listed on line {first_line[token]}; "
                "give each token one role"
            )
        tokens[token] = role
        first_line[token] = number
    if not tokens:
        raise ConfigurationError(f"token file {path} holds no tokens")
    return tokens


def _warn_if_readable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "token file %s can be read by other users (mode %s): chmod 600 it",
            path,
            oct(stat.S_IMODE(mode)),
        )


def role_of(tokens: dict[str, Role], presented: str) -> Role | None:
    """The role of a presented token (constant-time comparison against every token)."""
    found = None
    for token, role in tokens.items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = role
    return found
