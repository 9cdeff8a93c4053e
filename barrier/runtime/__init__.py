"""The Spark job runtime: :class:`Job` (what a job is), :class:`JobRunner` (what runs it),
:class:`BarrierContext` (what a step sees for one barrier) and the SparkSession set-up."""

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner, StepFn

__all__ = ["BarrierContext", "Job", "JobRunner", "StepFn"]
