"""A user's own Spark configuration, for ``lockstep exec``'s programs (tests, benchmarks)."""

from __future__ import annotations

from pathlib import Path


def user_spark_conf(folder: Path) -> Path:
    """``folder`` (made) holding a ``spark-defaults.conf`` as small and quick as a laptop's
    should be, and nothing about a metastore: where that lives is exec's to choose
    (``lockstep/cli/exec_env.py``'s ``local_metastore``); ``folder``, for
    ``SPARK_CONF_DIR``.

    >>> import tempfile
    >>> conf = user_spark_conf(Path(tempfile.mkdtemp()) / "conf")
    >>> (conf / "spark-defaults.conf").read_text().splitlines()[0]
    'spark.master local[2]'
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spark-defaults.conf").write_text(
        "spark.master local[2]\n"
        "spark.ui.enabled false\n"
        "spark.ui.showConsoleProgress false\n"
        "spark.sql.shuffle.partitions 2\n"
        "spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC\n"
    )
    return folder
