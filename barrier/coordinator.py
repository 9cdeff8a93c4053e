"""Kept so that ``lockstep.barrier.coordinator`` keeps working where users import it: the
barrier issuer is :mod:`lockstep.barrier.issuer` (the service is "the coordinator")."""

from lockstep.barrier.issuer import (
    LEADERSHIP,
    MIN_LEASE_TTL_S,
    BackgroundIssuer,
    BarrierIssuer,
    HoldBack,
    Interval,
    IssuePolicy,
    OnDemand,
    PipelineState,
    default_holder,
)

__all__ = [
    "LEADERSHIP",
    "MIN_LEASE_TTL_S",
    "BackgroundIssuer",
    "BarrierIssuer",
    "HoldBack",
    "Interval",
    "IssuePolicy",
    "OnDemand",
    "PipelineState",
    "default_holder",
]
