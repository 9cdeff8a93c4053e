"""The file ``lockstep job apply`` reads: a JSON list of jobs, each as ``job register`` takes
it, so a platform's pipelines can be kept in one file and registered in one command.

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "jobs.json"
>>> _ = path.write_text('[{"job_id": "load", "sinks": ["raw"], "external_sources": ["kafka:o"]},'
...                     ' {"job_id": "clean", "sources": ["raw"], "sinks": ["clean"]}]')
>>> [spec.job_id for spec in load_jobs_file(path)]
['load', 'clean']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lockstep.errors import InvalidRequestError, LockstepError
from lockstep.topology.model import JobSpec

LISTS = ("sources", "sinks", "external_sources")
EXAMPLE = '[{"job_id": "load", "sinks": ["raw"]}, {"job_id": "clean", "sources": ["raw"], ...}]'


def load_jobs_file(path: Path) -> list[JobSpec]:
    """The jobs of ``path``, in its order; an error names the file, the job and the fix."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidRequestError(f"cannot read the jobs file {path}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"the jobs file {path} is not JSON: {e}") from e
    if isinstance(data, dict) and set(data) == {"jobs"}:  # the service's body, as it is
        data = data["jobs"]
    if not isinstance(data, list) or not data:
        raise InvalidRequestError(f"{path}: give a JSON list of jobs, such as {EXAMPLE}")
    return [_spec(entry, f"{path}, job #{n}") for n, entry in enumerate(data, 1)]


def _spec(entry: Any, where: str) -> JobSpec:
    if not isinstance(entry, dict):
        raise InvalidRequestError(f"{where}: a job is a JSON object, such as {EXAMPLE}")
    unknown = sorted(set(entry) - {"job_id", *LISTS, "catch_up"})
    if unknown:
        raise InvalidRequestError(
            f"{where}: unknown field(s) {', '.join(unknown)}; a job has job_id, "
            f"{', '.join(LISTS)} and catch_up"
        )
    if not isinstance(entry.get("job_id"), str):
        raise InvalidRequestError(f"{where}: job_id is missing or not a string")
    for field in LISTS:
        values = entry.get(field, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidRequestError(
                f"{where} ({entry['job_id']}): {field} is not a list of names"
            )
    catch_up = entry.get("catch_up", False)
    if not isinstance(catch_up, bool):
        raise InvalidRequestError(f"{where} ({entry['job_id']}): catch_up is true or false")
    try:
        return JobSpec(
            entry["job_id"],
            sources=tuple(entry.get("sources", ())),
            sinks=tuple(entry.get("sinks", ())),
            external_sources=tuple(entry.get("external_sources", ())),
            catch_up=catch_up,
        )
    except LockstepError as e:  # a bad name, no sinks, a table both read and written
        raise InvalidRequestError(f"{where}: {e}") from e
