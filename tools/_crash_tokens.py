"""The service run's tokens: least privilege, as docs/deploy.md recommends.

The replicas serve with a token file holding an admin token (the harness's issuers: they
issue barriers and lead), a read token (its reader) and one job token per job process,
naming that process's jobs only. Each child gets its token in ``$LOCKSTEP_TOKEN``, which
``lockstep.connect`` reads; the harness itself looks at the store directly.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lockstep.config import TOKEN_ENV


@dataclass(frozen=True)
class RunTokens:
    admin: str
    read: str
    jobs: Mapping[str, str]  # job process name -> its job token

    @classmethod
    def new(cls, processes: Mapping[str, Sequence[str]]) -> RunTokens:
        return cls(
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(24),
            {name: secrets.token_urlsafe(24) for name in processes},
        )

    def write(self, path: Path, processes: Mapping[str, Sequence[str]]) -> Path:
        """The token file the replicas serve with (``chmod 600``)."""
        lines = [f"admin {self.admin}", f"read {self.read}"]
        lines += [f"job {','.join(processes[name])} {token}" for name, token in self.jobs.items()]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    @staticmethod
    def env(token: str) -> dict[str, str]:
        return {TOKEN_ENV: token}
