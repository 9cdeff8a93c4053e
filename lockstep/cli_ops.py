"""Operations subcommands: ``revise``, ``expire``, ``repair`` (DESIGN §7).

They are registered by :func:`add_ops_commands` from ``lockstep.cli.build_parser``.
"""

from __future__ import annotations

from typing import Any


def add_ops_commands(sub: Any, cmds: Any) -> None:
    """Register the operations subcommands on ``sub`` (``cmds`` is ``cli._Commands``)."""
