"""Which jobs ``lockstep run`` runs (``MODULE:JOB``, ``MODULE:*``) and how several share one
process: each on its own thread, or in rounds until none has work (``--until-idle``)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from lockstep.barrier.runtime.runner import Job, JobRunner

ALL_JOBS = "*"  # MODULE:* runs the module's JOBS list
JOIN_S = 0.5  # the main thread wakes this often while jobs run, to take signals


def load_jobs(references: Sequence[str]) -> list[Job]:
    """The jobs named by ``references``, in order; ``MODULE:*`` is the module's ``JOBS``.

    >>> [j.job_id for j in load_jobs(["lockstep.examples.shopping:*"])]
    ['load_shopping', 'sum_amount', 'sum_price']
    """
    jobs: list[Job] = []
    for reference in references:
        module_name, _, attribute = reference.partition(":")
        if attribute == ALL_JOBS and module_name:
            jobs += _module_jobs(module_name)
        else:
            jobs.append(load_job(reference))
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise LockstepError(f"job {job.job_id!r} is named twice; run each job once")
        seen.add(job.job_id)
    return jobs


def _module_jobs(module_name: str) -> list[Job]:
    from lockstep.barrier.runtime.runner import Job

    jobs = getattr(_import(module_name), "JOBS", None)
    if not isinstance(jobs, (list, tuple)) or not all(isinstance(j, Job) for j in jobs):
        raise LockstepError(
            f"{module_name}:* runs the module's JOBS, a list of Jobs (upstream first), "
            f"which {module_name!r} does not define; name the jobs one by one instead"
        )
    return list(jobs)


def _import(module_name: str) -> Any:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a module in this folder
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise LockstepError(
            f"cannot import module {module_name!r}: {e} (looked in the current folder and "
            "on the Python path; run from the module's folder or set PYTHONPATH)"
        ) from e


def load_job(reference: str) -> Job:
    """The :class:`Job` named by ``module:attribute`` (a Job, or a zero-argument callable
    returning one).

    >>> load_job("lockstep.examples.shopping:sum_price").sinks
    ['user_item_price']
    """
    from lockstep.barrier.runtime.runner import Job

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise LockstepError(
            f"expected MODULE:JOB, e.g. lockstep.examples.shopping:load_shopping; got {reference!r}"
        )
    module = _import(module_name)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            jobs = sorted(n for n, v in vars(module).items() if isinstance(v, Job))
            raise LockstepError(
                f"module {module_name!r} has no {attribute!r}; jobs it defines: "
                f"{', '.join(jobs) or '(none)'}"
            )
        target = getattr(target, part)
    job = _call_factory(reference, target) if callable(target) else target
    if not isinstance(job, Job):
        raise LockstepError(
            f"{reference} is a {type(job).__name__}, not a lockstep Job (or a zero-argument "
            "callable returning one)"
        )
    return job


def _call_factory(reference: str, factory: Any) -> Any:
    """Call a job factory, refusing one that needs arguments (rather than a TypeError)."""
    from lockstep.barrier.runtime.runner import Job

    if isinstance(factory, Job):  # a frozen dataclass instance is not callable, but be safe
        return factory
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise LockstepError(
            f"{reference} takes arguments; name a Job, or a callable that needs none"
        ) from None
    except ValueError:
        pass  # no signature to check (a builtin): just call it
    return factory()


def run_jobs(
    runners: Sequence[JobRunner],
    *,
    stop: threading.Event,
    max_barriers: int | None = None,
    until_idle: bool = False,
) -> dict[str, int]:
    """Run every job; returns how many barriers each processed.

    One job runs in the calling thread. Several run each on its own thread until ``stop``
    (or ``max_barriers`` each); a job that fails stops the others and its error is raised.
    With ``until_idle`` they run in rounds, upstream first, until a round finds no work for
    any of them: a downstream job idle now may get work once its upstream writes.
    """
    if until_idle:
        return _rounds(runners, stop, max_barriers)
    if len(runners) == 1:
        only = runners[0]
        return {only.job.job_id: only.run(max_barriers=max_barriers, stop=stop)}
    done = {r.job.job_id: 0 for r in runners}
    failures: list[BaseException] = []

    def work(runner: JobRunner) -> None:
        try:
            done[runner.job.job_id] = runner.run(max_barriers=max_barriers, stop=stop)
        except BaseException as e:  # handed to the main thread, which raises it
            failures.append(e)
            stop.set()

    threads = [
        threading.Thread(target=work, args=(r,), name=f"job-{r.job.job_id}") for r in runners
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(JOIN_S)  # not a bare join(): the main thread must take Ctrl-C
    if failures:
        raise failures[0]
    return done


def _rounds(
    runners: Sequence[JobRunner], stop: threading.Event, max_barriers: int | None
) -> dict[str, int]:
    done = {r.job.job_id: 0 for r in runners}
    while not stop.is_set():
        progressed = 0
        for runner in runners:
            left = None if max_barriers is None else max_barriers - done[runner.job.job_id]
            if left == 0 or stop.is_set():
                continue
            processed = runner.run(max_barriers=left, stop=stop, until_idle=True)
            done[runner.job.job_id] += processed
            progressed += processed
        if progressed == 0:
            break
    return done
