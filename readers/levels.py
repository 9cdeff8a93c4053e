"""Consistency levels, each with its own semantics (DESIGN §3).

A level is a point on two axes: which versions it may read (PROCESSED, i.e. staged and
still abortable, or only WRITTEN) and whether every table must be read at one common
barrier. Resolution (the store's ``resolve``) reads these flags and never branches on a
level by name, so a new level on the same axes is one entry here.

>>> ConsistencyLevel.parse("Read-Committed").semantics
Semantics(written_only=False, common_barrier=True, never_backwards=False)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lockstep.errors import LockstepError


@dataclass(frozen=True)
class Semantics:
    """What a level promises and therefore what resolution must do."""

    written_only: bool  # read only WRITTEN (published) versions, never staged ones
    common_barrier: bool  # every table at one barrier (else: each table's newest version)
    never_backwards: bool  # a repeated read never returns an older barrier (no revision)


class ConsistencyLevel(str, enum.Enum):
    """How a snapshot set is chosen."""

    READ_UNCOMMITTED = "read_uncommitted"  # newest snapshot of each table; may mix barriers
    READ_COMMITTED = "read_committed"  # newest barrier PROCESSED in all; may go backwards
    REPEATABLE_READ = "repeatable_read"  # newest barrier WRITTEN in all; never goes backwards

    @property
    def semantics(self) -> Semantics:
        return SEMANTICS[self]

    @property
    def abbreviation(self) -> str:
        """Two letters: where a level's full name is too long (a pinned catalog view's
        prefix, ``rr-<lease>.<key>``)."""
        return ABBREVIATIONS[self]

    @classmethod
    def parse(cls, value: str | ConsistencyLevel) -> ConsistencyLevel:
        if isinstance(value, ConsistencyLevel):
            return value
        normalized = str(value).strip().lower().replace("-", "_").replace(" ", "_")
        try:
            return cls(normalized)
        except ValueError:
            choices = ", ".join(level.value for level in cls)
            raise LockstepError(
                f"unknown consistency level {value!r}; use one of {choices}"
            ) from None


SEMANTICS: dict[ConsistencyLevel, Semantics] = {
    ConsistencyLevel.READ_UNCOMMITTED: Semantics(
        written_only=False, common_barrier=False, never_backwards=False
    ),
    ConsistencyLevel.READ_COMMITTED: Semantics(
        written_only=False, common_barrier=True, never_backwards=False
    ),
    ConsistencyLevel.REPEATABLE_READ: Semantics(
        written_only=True, common_barrier=True, never_backwards=True
    ),
}

ABBREVIATIONS: dict[ConsistencyLevel, str] = {
    ConsistencyLevel.READ_UNCOMMITTED: "ru",
    ConsistencyLevel.READ_COMMITTED: "rc",
    ConsistencyLevel.REPEATABLE_READ: "rr",
}
