"""Which jobs ``lockstep run`` runs (``MODULE:JOB``, ``MODULE:*``); how several share one
process is :mod:`lockstep.cli.supervise`."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from lockstep.barrier.runtime.runner import Job

ALL_JOBS = "*"  # MODULE:* runs the module's JOBS list


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
