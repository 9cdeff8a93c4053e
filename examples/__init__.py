"""Example pipelines, importable as ``lockstep.examples.<name>`` (copy them as a start).

- ``shopping``: the FLIP-276 pipeline (one root, two incremental aggregates); ``lockstep demo``.
- ``deep``: two roots, a join of them, an incremental and a full aggregate, and a join of
  those two: barrier alignment across inputs, three levels deep.

Each defines its jobs (``JOBS``, upstream first), deterministic generators for its roots and
a plain-Python ground truth, so a run can be checked table by table.
"""
