"""Why a crash-harness child ended, from its log (``tools/_crash_last_words.py``, #48 item 11).

The shape of the log is a real one (a crash run's ``jobs-a.log``, frames cut): a job that
failed on its JDBC catalog after PostgreSQL restarted, then its JVM's shutdown noise,
which the harness used to report as the reason ("a Spark/JVM error").
"""

from __future__ import annotations

from _crash_last_words import last_words, why_it_ended

FRAMES = "".join(f"\tat org.example.Frame.f{i}(Frame.java:{i})\n" for i in range(30))
FAILED_ON_JDBC = f"""\
enrich wrote 1
job enrich failed:
Traceback (most recent call last):
  File "barrier/runtime/runner.py", line 360, in _step
    self.job.step(ctx)
  File "barrier/iceberg/tables.py", line 149, in exists
    return bool(spark.catalog.tableExists(self.identifier(table)))
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "py4j/protocol.py", line 327, in get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o67.tableExists.
: org.apache.iceberg.jdbc.UncheckedSQLException: Failed to get table default.enriched
{FRAMES}\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: org.postgresql.util.PSQLException: FATAL: terminating connection due to \
administrator command
{FRAMES}\t... 25 more


The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "tools/_crash_jobs.py", line 122, in job_thread
    run_until_final(ls, runner, args.run_dir, stop)
  File "barrier/runtime/runner.py", line 364, in _step
    raise JobStepError(self.job.job_id, ctx.barrier.barrier_id, e) from e
lockstep.errors.JobStepError: job 'enrich' failed at barrier 1: Py4JJavaError: An error \
occurred while calling o67.tableExists.
26/11/29 07:38:37 ERROR Inbox: Ignoring error
java.util.concurrent.RejectedExecutionException: Task org.apache.spark.executor.Executor$\
TaskRunner@5b6ad60f rejected from java.util.concurrent.ThreadPoolExecutor@7dd545e4\
[Shutting down, pool size = 1, active threads = 1, queued tasks = 0, completed tasks = 6]
{FRAMES}\tat java.base/java.lang.Thread.run(Thread.java:840)
"""


def test_the_reason_is_what_python_raised_and_the_jvm_threw_not_the_jvms_shutdown() -> None:
    assert why_it_ended(FAILED_ON_JDBC) == (
        "lockstep.errors.JobStepError: job 'enrich' failed at barrier 1: Py4JJavaError: An "
        "error occurred while calling o67.tableExists. [the JVM threw "
        "org.apache.iceberg.jdbc.UncheckedSQLException: Failed to get table default.enriched; "
        "caused by org.postgresql.util.PSQLException: FATAL: terminating connection due to "
        "administrator command]"
    )


def test_a_py4j_error_that_ended_the_process_itself() -> None:
    unchained = FAILED_ON_JDBC[: FAILED_ON_JDBC.index("\n\nThe above")]
    said = why_it_ended(unchained + "\n26/11/29 ERROR Inbox: Ignoring error\n")
    assert said.startswith("py4j.protocol.Py4JJavaError: An error occurred while calling o67")
    assert "[the JVM threw org.apache.iceberg.jdbc.UncheckedSQLException" in said
    assert "RejectedExecutionException" not in said


def test_without_a_traceback_the_last_line_naming_an_error() -> None:
    died = "a wrote 2\n# A fatal error has been detected by the Java Runtime Environment:\n"
    died += "java.lang.OutOfMemoryError: Java heap space\n\tat x.y(Z.java:1)\n"
    assert why_it_ended(died) == "java.lang.OutOfMemoryError: Java heap space"
    assert why_it_ended("a wrote 2\nbye\n") == "bye"
    assert why_it_ended("") == ""


def test_last_words_keep_the_failure_and_cut_the_frames() -> None:
    words = last_words(FAILED_ON_JDBC).splitlines()
    assert words[0] == "job enrich failed:"  # what came before the failure is left out
    assert len(words) < 60
    for line in (
        ": org.apache.iceberg.jdbc.UncheckedSQLException: Failed to get table default.enriched",
        "26/11/29 07:38:37 ERROR Inbox: Ignoring error",
    ):
        assert line in words
    assert any(line.startswith("Caused by: org.postgresql.util.PSQLException") for line in words)
    assert "\tat org.example.Frame.f2(Frame.java:2)" in words
    assert "\tat org.example.Frame.f3(Frame.java:3)" not in words  # three frames a run
    assert last_words("a wrote 1\nb wrote 1\n", count=1) == "b wrote 1"
