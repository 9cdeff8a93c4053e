"""What a child of the crash harness said as it died: why it ended, and its last lines.

A job process that fails prints ``job X failed:`` and Python's traceback, and ends at once
(``os._exit``). Its JVM then loses its parent and shuts down, and a task being launched
meanwhile makes Spark print ``ERROR Inbox: Ignoring error`` and a
``RejectedExecutionException`` whose trace ends ``at java.lang.Thread.run``, into the same
log, after the traceback. The harness used to take the last exception line of the log as
the reason: a job that died of a JDBC error after a PostgreSQL restart was reported as
having died of that Spark error (#48 item 11: "a job process died of a Spark/JVM error",
whose log's tail was ``at java.lang.Thread.run``). The reason is now the exception Python
raised, with the Java exception a ``Py4JJavaError`` carried and its causes; the JVM's
words after it are context, not the reason.
"""

from __future__ import annotations

TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
JAVA_LINES = (": ", "Caused by: ", "Suppressed: ")  # a Java trace inside Python's message


def why_it_ended(output: str) -> str:
    """Why a process ended, from its output: the last exception Python raised (and what
    the JVM threw, if a Java exception came through Py4J), else its last line naming an
    exception or error, else its last line that is not a stack frame.

    >>> why_it_ended(TRACEBACK + "\\n  File 'job.py', line 9\\nKeyError: 'x'\\nERROR Inbox: ...")
    "KeyError: 'x'"
    """
    lines = [line.rstrip() for line in output.strip().splitlines()]
    start = _chain_start(lines)
    if start is None:
        said = [line.strip() for line in lines if line.strip()]
        said = [line for line in said if not line.startswith(("at ", "File ", "..."))]
        errors = [line for line in said if "Exception" in line or "Error" in line]
        return (errors or said or [""])[-1][:500]
    chain = _chain(lines[start:])
    last = max(i for i, line in enumerate(chain) if line == TRACEBACK)
    raised = next((line for line in chain[last + 1 :] if line and not line[0].isspace()), "")
    thrown = [line[2:] for line in chain if line.startswith(": ")]
    causes = [line.removeprefix("Caused by: ") for line in chain if line.startswith("Caused by: ")]
    if thrown:
        raised += " [the JVM threw " + "; caused by ".join([thrown[0], *causes]) + "]"
    return raised[:500]


def last_words(output: str, count: int = 80, frames: int = 3) -> str:
    """What a dying process printed from its last Python traceback on (everything, if it
    printed none), each run of Java stack frames cut to its first ``frames``, at most the
    last ``count`` lines: short enough for a CI log, whose run folder is gone."""
    lines = output.rstrip().splitlines()
    start = _chain_start(lines)
    if start is not None and start > 0:
        start -= 1  # the job process's "job X failed:" line
    kept: list[str] = []
    run = 0  # Java frames in a row so far
    for line in lines[start or 0 :]:
        run = run + 1 if line.lstrip().startswith(("at ", "... ")) else 0  # Java's frames
        if run <= frames:
            kept.append(line)
        elif run == frames + 1:
            kept.append("\t...")
    return "\n".join(kept[-count:])


def _chain_start(lines: list[str]) -> int | None:
    """The first line of the last chain of Python tracebacks (None: no traceback)."""
    starts = [i for i, line in enumerate(lines) if line == TRACEBACK]
    if not starts:
        return None
    k = len(starts) - 1
    while k > 0 and any(line.startswith(CHAINED) for line in lines[starts[k - 1] : starts[k]]):
        k -= 1
    return starts[k]


def _chain(lines: list[str]) -> list[str]:
    """``lines`` (from a chain's first traceback) up to the end of its last exception's
    message, Java trace included: what the process printed after it is left out."""
    last = max(i for i, line in enumerate(lines) if line == TRACEBACK)
    end = last + 1
    while end < len(lines) and (not lines[end] or lines[end][0].isspace()):
        end += 1  # the frames of the last traceback
    end += 1  # its exception line
    while end < len(lines) and lines[end].startswith((*JAVA_LINES, "\t", " ")):
        end += 1
    return lines[:end]
