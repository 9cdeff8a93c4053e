"""How the crash harness picks and makes its disturbances (the faults themselves, followed
over the run's ticks, are in :mod:`_crash_faults`).

Each disturbance kind has a weight (``RunPlan.weights``) and a minimum; once the chaos
time is over, only kinds still short of their minimum are picked. A kill is done at
once (the process restarted); a pause or a PostgreSQL restart becomes a fault the run
ticks until it is over; nothing else is started meanwhile.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from _crash_faults import JobPause, LeaderPause, PgRestart
from _crash_jobs import JOB_PROCESSES
from _crash_log import missing_points

if TYPE_CHECKING:
    from _crash_procs import Managed
    from _crash_run import CrashRun

FAULT_KINDS = ("job_kill", "coordinator_kill", "job_pause", "leader_pause", "pg_restart")
# A job process of the embedded coordinator is a coordinator too: paused inside a store
# write, it holds SQLite's lock, and every other process's writes wait for it (attaching a
# replacement included) until it thaws. Nothing can end a frozen SQLite writer's lock, so
# job processes are paused in service runs only (their calls are HTTP: they hold nothing).
SERVICE_ONLY = ("job_pause", "leader_pause", "pg_restart")


def done_counts(run: CrashRun) -> dict[str, int]:
    r = run.result
    return {
        "job_kill": r.job_kills,
        "coordinator_kill": r.coordinator_kills,
        "job_pause": r.job_pauses,
        "leader_pause": r.leader_takeovers,  # a pause counts once another led and issued
        "pg_restart": r.pg_restarts,
    }


def missing_kinds(run: CrashRun) -> list[str]:
    """The kinds of disturbance still short of the plan's minimums."""
    plan, counts = run.plan, done_counts(run)
    minimums = {
        "job_kill": plan.min_job_kills,
        "coordinator_kill": plan.min_coordinator_kills,
        "job_pause": plan.min_job_pauses if run.replicas else 0,
        "leader_pause": plan.min_leader_pauses if run.replicas else 0,
        "pg_restart": plan.min_pg_restarts if run.pg else 0,
    }
    missing = [kind for kind in FAULT_KINDS if counts[kind] < minimums[kind]]
    short = plan.log and missing_points(run.result.fault_points, plan.min_log_faults)
    if short and "job_kill" not in missing:  # a log point short of its kills: job processes
        missing.append("job_kill")  # are killed, their restarts pick it (_crash_log)
    return missing


def disturb(run: CrashRun, chaos_over: bool) -> bool:
    """One random disturbance (once chaos is over: one still missing); False if the
    chosen kind cannot happen right now."""
    if run.faults:
        return False  # one at a time: a kill during a pause could leave nothing to take over
    kinds = [k for k in FAULT_KINDS if run.plan.weights.get(k, 0) > 0]
    if not run.replicas:  # the service's faults; and see SERVICE_ONLY on job pauses
        kinds = [k for k in kinds if k not in SERVICE_ONLY]
    missing = [k for k in missing_kinds(run) if k in kinds]
    if chaos_over and missing:
        kinds = missing
    kind = run.rng.choices(kinds, weights=[run.plan.weights[k] for k in kinds])[0]
    if kind == "job_kill":
        return kill_job(run)
    if kind == "coordinator_kill":
        return kill_coordinator(run)
    if kind == "job_pause":
        return pause_job(run)
    if kind == "leader_pause":
        return pause_leader(run)
    run.faults.append(PgRestart(run.rng.choice(("fast", "immediate"))))
    return True


def kill_job(run: CrashRun) -> bool:
    jobs = [j for j in run.jobs if run.working(j) and not awaits_fault(run, j)]
    if not jobs:
        return False
    victim = run.rng.choice(jobs)
    victim.kill()
    run.result.job_kills += 1
    run.log(f"SIGKILL {victim.name} (jobs {', '.join(JOB_PROCESSES[victim.name])})")
    run.restart_job(victim, faults=True)
    return True


def awaits_fault(run: CrashRun, process: Managed) -> bool:
    """Whether the process is left to reach its protocol-point fault: with the log tier,
    while a log point is short of its kills (on a loaded machine a job process killed
    after each barrier it writes would seldom reach its fault)."""
    plan = run.plan
    if not plan.log or process.fault is None:
        return False
    return bool(missing_points(run.result.fault_points, plan.min_log_faults))


def coordinator_pairs(run: CrashRun) -> list[tuple[Managed, Managed]]:
    """The coordinator's processes: (replica, its issuer), or (the issuer, itself)."""
    if run.replicas:
        return list(zip(run.replicas, run.issuers, strict=True))
    return [(issuer, issuer) for issuer in run.issuers]


def kill_coordinator(run: CrashRun) -> bool:
    plan = run.plan
    alive = [pair for pair in coordinator_pairs(run) if pair[0].poll() is None]
    if not alive:
        return False
    outage = len(alive) > 1 and run.rng.random() < plan.outage_probability
    victims = alive if outage else [run.rng.choice(alive)]
    for replica, issuer in victims:
        replica.kill()
        issuer.kill()
    run.result.coordinator_kills += len(victims)
    run.result.outages += outage
    names = ", ".join(v[0].name for v in victims)
    run.log(f"SIGKILL coordinator {names}" + (" (an outage)" if outage else ""))
    time.sleep(run.rng.uniform(*(plan.outage_s if outage else plan.coordinator_down_s)))
    for replica, issuer in victims:
        if replica in run.replicas:
            run.start_replica(replica)
        issuer.start()
    run.log(f"restarted {names}")
    return True


def pause_job(run: CrashRun) -> bool:
    jobs = [j for j in run.jobs if run.working(j)]
    if not jobs:
        return False
    victim = run.rng.choice(jobs)
    victim.pause()
    run.result.job_pauses += 1
    run.faults.append(JobPause(victim, JOB_PROCESSES[victim.name]))
    run.log(f"SIGSTOP {victim.name} (jobs {', '.join(JOB_PROCESSES[victim.name])})")
    return True


def pause_leader(run: CrashRun) -> bool:
    pairs = coordinator_pairs(run)
    leading = [p for p in pairs if p[0].poll() is None and _leads(p[1])]
    if len(leading) != 1 or any(p[0].poll() is not None for p in pairs):
        return False  # a takeover or a restart under way: later
    paused = leading[0]
    for process in paused:
        process.pause()
    others = [issuer for _, issuer in pairs if issuer is not paused[1]]
    marks = {i.name: i.log.stat().st_size if i.log.exists() else 0 for i in run.issuers}
    pause_s = run.rng.uniform(*run.plan.leader_pause_s)
    run.faults.append(LeaderPause(paused, others, marks, pause_s=pause_s))
    run.result.leader_pauses += 1
    run.log(f"SIGSTOP leading replica {paused[0].name} and its issuer")
    return True


def _leads(issuer: Managed) -> bool:
    """Whether the issuer's last word on its leadership, since it started, is "leading"."""
    said = issuer.last_output(max_chars=200_000).splitlines()
    words = [line for line in said if line in ("leading", "following")]
    return bool(words) and words[-1] == "leading"
