"""Consistency levels, each with its own semantics (DESIGN §3).

A level is a point on two axes: which versions it may read (PROCESSED, i.e. staged and
still abortable, or only WRITTEN) and whether every table must be read at one common
barrier. Everything that treats levels differently reads these flags, never a level's
name: resolution (the store's ``resolve``), the service's answers from memory and the
client's floors (``readers/seen.py``: WRITTEN versions only), the served catalog's pinned
views (``service/iceberg/pinned.py``: a common barrier). Everything that lists the levels
lists :class:`ConsistencyLevel` (the CLI's ``--level``, the pinned views' warehouses), or
:data:`LevelName` (the facade's type). So a new level on the same axes is one entry in the
enum, in :data:`SEMANTICS`, in :data:`ABBREVIATIONS` and in :data:`LevelName`
(``tests/readers/test_levels.py`` checks that every place offers every level).

>>> ConsistencyLevel.parse("Read-Committed").semantics
Semantics(written_only=False, common_barrier=True)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from lockstep.errors import LockstepError


@dataclass(frozen=True)
class Semantics:
    """What a level promises and therefore what resolution must do.

    Whether a repeated read may go backwards is no axis of its own: only a staged version
    is rolled back, so a level that reads only WRITTEN versions never goes backwards (until
    its client revises, repairs or expires: see ``readers/seen.py``), and one that reads
    PROCESSED versions may.
    """

    written_only: bool  # read only WRITTEN (published) versions, never staged ones
    common_barrier: bool  # every table at one barrier (else: each table's newest version)


LevelName = Literal["read_uncommitted", "read_committed", "repeatable_read"]
"""A level by its name, as the facade takes it: the values of :class:`ConsistencyLevel`
(a type checker needs them spelled out; ``tests/readers/test_levels.py`` keeps them equal)."""


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
    ConsistencyLevel.READ_UNCOMMITTED: Semantics(written_only=False, common_barrier=False),
    ConsistencyLevel.READ_COMMITTED: Semantics(written_only=False, common_barrier=True),
    ConsistencyLevel.REPEATABLE_READ: Semantics(written_only=True, common_barrier=True),
}

ABBREVIATIONS: dict[ConsistencyLevel, str] = {
    ConsistencyLevel.READ_UNCOMMITTED: "ru",
    ConsistencyLevel.READ_COMMITTED: "rc",
    ConsistencyLevel.REPEATABLE_READ: "rr",
}
