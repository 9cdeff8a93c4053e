"""The crash harness's faults beyond SIGKILL, each followed to its end over the run's ticks.

- :class:`JobPause`: a job process (Python and its JVM) is stopped with SIGSTOP. Its
  instances' heartbeats go stale; the harness, as a supervisor would, then starts a
  replacement, whose instances attach and fence the paused ones. Once the replacement's
  instances beat, the paused process is resumed (SIGCONT), long past its heartbeat: its
  late calls must be refused (it ends with ``FencedError``) and nothing it still commits
  may reach a table's published history (the final check of every table).
- :class:`LeaderPause` (service): the replica whose issuer leads is stopped with its
  issuer. Another replica's issuer must take the leadership over and then issue (unless
  it loses the leadership first, to a kill); the paused one, resumed, must follow.
  Requests that reached the paused replica are answered late.
- :class:`PgRestart` (service): PostgreSQL, the service's store and the JDBC catalog, is
  restarted (a clean ``fast`` shutdown or an ``immediate`` one, as a crash) in the middle
  of a barrier: some tables have written the newest barrier and some not.
- :class:`S3Restart` (object store): the S3 server holding the tables (``tools/_crash_s3.py``)
  is restarted the same way (``graceful`` or ``kill``), in the middle of a barrier.

Each fault is an object the run ticks (:meth:`tick` returns True once it is over), so the
run goes on tending its processes and reading while a fault unfolds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from _crash_last_words import last_words, why_it_ended
from _crash_procs import START_MARK

if TYPE_CHECKING:
    from _crash_procs import Managed
    from _crash_run import CrashRun

STAGE_DEADLINE_S = 180.0  # a fault that does not move on within this is a problem
REFUSED = "FencedError"


@dataclass
class JobPause:
    """A paused job process, its replacement, and the paused one resumed."""

    victim: Managed  # the process slot (after the replacement: the replacement)
    jobs: tuple[str, ...]
    began: float = field(default_factory=time.monotonic)
    ghost: Managed | None = None  # the paused process, once the replacement started
    replaced_at: datetime | None = None  # the store's clock then
    resumed_at: float | None = None
    stage_since: float = field(default_factory=time.monotonic)

    def tick(self, run: CrashRun) -> bool:
        now = time.monotonic()
        if now - self.stage_since > STAGE_DEADLINE_S:
            return self._give_up(run, now)
        if self.ghost is None:
            silent = run.silent_s(self.jobs)
            if silent is None or silent < run.plan.stale_after_s:
                return False
            self.replaced_at = run.store_now()
            self.ghost = self.victim.detach(
                f"{self.victim.name}-paused", run.workdir / f"{self.victim.name}.{now:.0f}.log"
            )
            self.victim.start()
            self.stage_since = now
            run.log(
                f"{self.ghost.name}: silent {silent:.1f}s (heartbeat {run.plan.heartbeat_s}s); "
                f"started a replacement of jobs {', '.join(self.jobs)}"
            )
            return False
        if self.resumed_at is None:
            assert self.replaced_at is not None
            if not run.seen_since(self.jobs, self.replaced_at):
                return False  # the replacement's instances have not attached and beaten yet
            self.ghost.resume()
            self.resumed_at = self.stage_since = now
            run.log(f"SIGCONT {self.ghost.name} after {now - self.began:.1f}s paused")
            return False
        code = self.ghost.poll()
        if code is None:
            return False
        refused = REFUSED in self.ghost.last_output(max_chars=200_000)
        run.result.fenced_exits += refused
        run.log(f"{self.ghost.name} ended ({code})" + (", its calls refused" if refused else ""))
        if code == 0 or not refused:
            output = self.ghost.last_output(max_chars=200_000)
            run.result.errors.append(
                f"{self.ghost.name}, resumed after its replacement attached, ended with "
                f"{code} without a refusal: {why_it_ended(output)}; its last lines:\n"
                + last_words(output)
            )
        return True

    def _give_up(self, run: CrashRun, now: float) -> bool:
        stage = (
            "its heartbeat never went stale"
            if self.ghost is None
            else "the replacement never beat"
            if self.resumed_at is None
            else "it went on running after it was resumed"
        )
        run.result.errors.append(f"paused {self.victim.name}: {stage} within {STAGE_DEADLINE_S}s")
        for process in (self.ghost, self.victim if self.ghost is None else None):
            if process is not None:
                process.resume()
        if self.ghost is not None:
            self.ghost.kill()
        return True

    def stop(self) -> None:
        """The run ends: nothing of the fault may outlive it."""
        if self.ghost is not None:
            self.ghost.kill()
        else:
            self.victim.resume()


@dataclass
class LeaderPause:
    """The leading replica and its issuer paused; another must take over and issue."""

    paused: tuple[Managed, Managed]  # the replica, its issuer
    others: list[Managed]  # the other replicas' issuers
    marks: dict[str, int]  # the size of each issuer's log at the pause
    began: float = field(default_factory=time.monotonic)
    pause_s: float = 6.0
    new_leader: Managed | None = None
    resumed_at: float | None = None
    followed: bool = False

    def tick(self, run: CrashRun) -> bool:
        now = time.monotonic()
        since = self.resumed_at or self.began
        if now - since > STAGE_DEADLINE_S:
            run.result.errors.append(self._problem())
            self.stop()
            return True
        if self.new_leader is None:
            self.new_leader = next((i for i in self.others if self._led(i)), None)
        if self.resumed_at is None:
            if self.new_leader is None or now - self.began < self.pause_s:
                return False
            for process in self.paused:
                process.resume()
            self.resumed_at = now
            run.log(
                f"SIGCONT {self.paused[0].name} after {now - self.began:.1f}s; "
                f"{self.new_leader.name} took the leadership over"
            )
            return False
        self.followed = self.followed or "following" in self._lines(self.paused[1])
        outcome = self._outcome()
        if not (self.followed and outcome):
            return False
        run.result.leader_takeovers += outcome == "issued"
        run.log(f"{self.new_leader.name}, leading since the pause, {outcome}")
        return True

    def _outcome(self) -> str | None:
        """What the replica that took over did next: "issued" a barrier, or "lost" the
        leadership first (killed, or another took over); None: neither yet."""
        assert self.new_leader is not None
        for line in self._after_lead(self.new_leader)[1:]:
            if line.startswith("issued barrier"):
                return "issued"
            if line == "following" or line.startswith(START_MARK):
                return "lost"
        return None

    def _lines(self, issuer: Managed) -> list[str]:
        """The issuer's output since the pause (over its restarts too)."""
        with issuer.log.open("rb") as f:
            f.seek(self.marks.get(issuer.name, 0))
            return f.read().decode(errors="replace").splitlines()

    def _led(self, issuer: Managed) -> bool:
        return "leading" in self._lines(issuer)

    def _after_lead(self, issuer: Managed) -> list[str]:
        lines = self._lines(issuer)
        return lines[lines.index("leading") :] if "leading" in lines else []

    def _problem(self) -> str:
        name = self.paused[0].name
        if self.new_leader is None:
            return f"no replica took the leadership over while {name} was paused"
        if not self.followed:
            return f"{name}'s issuer, resumed, never gave the leadership up"
        return f"{self.new_leader.name} took the leadership over and never issued"

    def stop(self) -> None:
        for process in self.paused:
            process.resume()


@dataclass
class MidBarrierRestart:
    """A server restarted once a barrier is under way (or after ``wait_s`` anyway)."""

    mode: str  # how it is stopped: see each server's restart
    armed: float = field(default_factory=time.monotonic)
    wait_s: float = 20.0
    server: ClassVar[str] = "a server"

    def tick(self, run: CrashRun) -> bool:
        written = run.written_now()
        midway = bool(written) and min(written.values()) < self.newest(run, written)
        if not midway and time.monotonic() - self.armed < self.wait_s:
            return False
        t0 = time.monotonic()
        self.restart(run)
        run.result.idle_restarts += not midway
        where = f"tables at barriers {sorted(set(written.values()))}" if midway else "idle"
        run.log(f"restarted {self.server} ({self.mode}) in {time.monotonic() - t0:.1f}s, {where}")
        return True

    def newest(self, run: CrashRun, written: dict[str, int]) -> int:
        """The barrier a table behind is under way to: the newest any table has written."""
        return max(written.values(), default=0)

    def restart(self, run: CrashRun) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        pass


@dataclass
class PgRestart(MidBarrierRestart):
    """PostgreSQL (``fast`` or ``immediate``)."""

    server: ClassVar[str] = "PostgreSQL"

    def restart(self, run: CrashRun) -> None:
        assert run.pg is not None
        run.pg.restart(self.mode)
        run.result.pg_restarts += 1
        run.pg_restarted_at = time.monotonic()


@dataclass
class S3Restart(MidBarrierRestart):
    """The S3 server (``graceful`` or ``kill``)."""

    server: ClassVar[str] = "the S3 server"

    def newest(self, run: CrashRun, written: dict[str, int]) -> int:
        """The newest barrier issued: a table that has not written it yet has its job
        writing files for it, or about to (the object store's part of a barrier)."""
        issued = run.look(lambda: run.ls.barriers(limit=1))
        return issued[0].barrier_id if issued else 0

    def restart(self, run: CrashRun) -> None:
        assert run.bucket is not None
        run.bucket.restart(self.mode)
        run.result.s3_restarts += 1
        run.s3_restarted_at = time.monotonic()
