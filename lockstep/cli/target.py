"""Which coordinator a command talks to, and as whom: ``--home``/``--store`` and, for a
service, the bearer token (``--token``, ``--token-file``, else ``$LOCKSTEP_TOKEN``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.config import TOKEN_ENV
from lockstep.errors import AuthenticationError, ConfigurationError, JobStepError, LockstepError

if TYPE_CHECKING:
    from lockstep.facade import Lockstep

DEBUG_ENV = "LOCKSTEP_DEBUG"  # set: a bug's traceback, not one line
TOKEN_HELP = (
    "give the service's token with --token TOKEN, --token-file FILE (the token alone on a "
    f"line) or ${TOKEN_ENV}"
)


def client_token(args: argparse.Namespace) -> str | None:
    """The bearer token for a service: ``--token``, else ``--token-file``, else the
    environment; None when none is given (an embedded store needs none)."""
    token: str | None = getattr(args, "token", None)
    if token:
        return token
    path: Path | None = getattr(args, "client_token_file", None)
    if path is not None:
        try:
            lines = [x.strip() for x in path.read_text(encoding="utf-8").splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigurationError(f"cannot read the token file {path}: {e}") from e
        found = [x for x in lines if x and not x.startswith("#")]
        if len(found) != 1 or len(found[0].split()) != 1:
            raise ConfigurationError(
                f"{path} should hold one token alone on a line (a service's 'ROLE TOKEN' "
                "file is for `lockstep serve --token-file`)"
            )
        return found[0]
    return os.environ.get(TOKEN_ENV) or None


def connect_args(args: argparse.Namespace) -> Lockstep:
    """The coordinator the command's ``--home``/``--store`` and token name, with the
    catalog of ``--catalog``/``--warehouse`` where the command has them."""
    from lockstep.facade import connect

    catalog_file: Path | None = getattr(args, "catalog_file", None)
    settings = catalog_settings(catalog_file) if catalog_file is not None else {}
    return connect(
        args.target,
        token=client_token(args),
        catalog=settings.get("catalog"),
        spark=settings.get("spark"),
        warehouse=getattr(args, "warehouse", None),
    )


def catalog_table(path: Path) -> dict[str, Any]:
    """The ``[catalog]`` table of a TOML file (a home's lockstep.toml, a service's
    settings)."""
    table: dict[str, Any] | None = catalog_settings(path).get("catalog")
    if table is None:
        raise ConfigurationError(f"{path} has no [catalog] table (type, uri, warehouse, ...)")
    return table


def catalog_settings(path: Path) -> dict[str, Any]:
    """The ``[catalog]`` and ``[spark]`` tables of a TOML file (either may be missing;
    other keys, such as a service's settings, are ignored)."""
    from lockstep.config import read_toml

    settings = read_toml(path)
    found: dict[str, Any] = {k: settings[k] for k in ("catalog", "spark") if k in settings}
    for key, table in found.items():
        if not isinstance(table, dict):
            raise ConfigurationError(f"{path}: {key} must be a table ([{key}])")
    if not found:
        raise ConfigurationError(
            f"{path} has neither a [catalog] table (type, uri, warehouse, ...) nor a [spark] "
            "table (master, jars, conf)"
        )
    return found


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    """--catalog FILE / --warehouse PATH: where the tables are, for a store URL (a home has
    its lockstep.toml, a service names its own catalog)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--catalog",
        dest="catalog_file",
        type=Path,
        metavar="FILE",
        help="a TOML file whose [catalog] table names the Iceberg catalog and/or whose "
        "[spark] table says how to start Spark (master, jars, conf)",
    )
    where.add_argument(
        "--warehouse",
        type=Path,
        metavar="PATH",
        help="a local Hadoop-catalog warehouse directory",
    )


def explain(error: Exception) -> str:
    """A refusal's message, with what to do when the CLI can do something about it; a
    user's step that raised, with its own frames."""
    if isinstance(error, AuthenticationError):
        return f"{error}; {TOKEN_HELP}"
    if isinstance(error, JobStepError):
        return f"{error}\n{error.step_traceback.rstrip()}"
    return str(error)


def describe(error: Exception) -> str:
    """What the CLI says of any error: a LockstepError :func:`explain`-ed; anything else is
    a bug of ours, said so in one line (with the traceback under ``$LOCKSTEP_DEBUG``)."""
    if isinstance(error, LockstepError):
        return explain(error)
    said = (
        f"unexpected {type(error).__name__}: {error} (this is a Lockstep bug; run again with "
        f"{DEBUG_ENV}=1 for the traceback, and please report it)"
    )
    if os.environ.get(DEBUG_ENV):
        import traceback

        said += "\n" + "".join(traceback.format_exception(error)).rstrip()
    return said


def add_client_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """--token and --token-file (for a coordinator service)."""
    default: Any = None if top_level else argparse.SUPPRESS
    who = parser.add_mutually_exclusive_group()
    who.add_argument(
        "--token", metavar="TOKEN", default=default, help=f"a service's bearer token (${TOKEN_ENV})"
    )
    who.add_argument(
        "--token-file",
        dest="client_token_file",
        type=Path,
        metavar="FILE",
        default=default,
        help="a file holding the service's bearer token",
    )
