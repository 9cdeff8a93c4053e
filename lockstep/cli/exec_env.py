"""What ``lockstep exec`` hands a program: the run's catalog, through the environment alone.

Three ways in, so that nothing in the program changes:

- Spark: a generated ``SPARK_CONF_DIR`` whose ``spark-defaults.conf`` is the user's own
  (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``) with the catalog added: its class,
  ``type rest``, ``uri``, this run's credential (``token``) and ``warehouse`` (which
  selects the run view), the Iceberg runtime jar and SQL extensions appended to the user's
  lists, and the catalog as ``spark.sql.defaultCatalog`` unless the user names another.
  ``spark-submit``, ``spark-sql`` and a plain ``python app.py`` that builds a SparkSession
  all read that file (DESIGN §11). The user's other files there (log4j2.properties,
  spark-env.sh) are linked.
  Unless the user's configuration says otherwise, Spark's local metastore (Derby's
  ``metastore_db`` and ``derby.log``, the default warehouse) is kept in exec's own folder,
  not the working directory (:func:`local_metastore`), and a local-mode driver binds the
  loopback address (:func:`loopback_variables`).
- pyiceberg: ``PYICEBERG_CATALOG__<NAME>__TYPE``/``URI``/``TOKEN``/``WAREHOUSE``, so
  ``load_catalog("<name>")`` just works (pyiceberg lower-cases the name and reads ``__``
  as ``.`` and ``_`` as ``-`` in what follows it: none of these four needs either).
- Everything else: ``LOCKSTEP_*`` variables (:data:`VARIABLES`), among them the barrier's
  time window, which a root program reads its outside source by, so a rerun of the
  barrier reads the same rows.

The token in all three is the run's credential (``service/iceberg/run_credentials.py``:
its run's view alone, refused once the run is over), never exec's own token; and what
exec's environment holds of Lockstep's credentials (:data:`INHERITED_CREDENTIALS`) is taken
out of the program's.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.errors import ConfigurationError
from lockstep.topology.names import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from lockstep.cli.exec_job import OpenRun

EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
DEFAULTS_FILE = "spark-defaults.conf"
HIVE_SITE = "hive-site.xml"  # a metastore of the user's: exec leaves the metastore alone
TOKENS_PATH = "/v1/oauth/tokens"  # the served catalog's (it says to send a token instead)
LOCAL_IP_ENV = "SPARK_LOCAL_IP"
LOOPBACK = "127.0.0.1"
# what each plain variable holds (the README and docs/exec.md list them from here)
VARIABLES = {
    "LOCKSTEP_JOB": "the job's id",
    "LOCKSTEP_BARRIER": "the barrier this run computes",
    "LOCKSTEP_BARRIER_TS": "its issue time, ISO 8601 UTC (a root reads its source up to it)",
    "LOCKSTEP_BARRIER_TS_MS": "the same, in milliseconds since the epoch",
    "LOCKSTEP_PREVIOUS_BARRIER": "the job's last WRITTEN barrier before it (empty: none)",
    "LOCKSTEP_PREVIOUS_BARRIER_TS": "its issue time (a root reads its source after it)",
    "LOCKSTEP_PREVIOUS_BARRIER_TS_MS": "the same, in milliseconds",
    "LOCKSTEP_PREVIOUS_TAG": "lockstep_b<previous>: each source's version then, by name",
    "LOCKSTEP_SOURCES": "the job's sources, comma separated (namespace.table)",
    "LOCKSTEP_SINKS": "the job's sinks, likewise",
    "LOCKSTEP_CATALOG_NAME": "the catalog's name in Spark and pyiceberg",
    "LOCKSTEP_CATALOG_URI": "the Iceberg REST catalog's URI",
    "LOCKSTEP_CATALOG_TOKEN": "the bearer token to call it with",
    "LOCKSTEP_CATALOG_WAREHOUSE": "the warehouse that selects this run's view",
    "LOCKSTEP_CATALOG_PREFIX": "the view's prefix (/v1/<prefix>/...), for raw REST calls",
}
# What exec takes out of its own environment before handing it to the program (names, ``*``
# any rest; ``{run}``: the run's catalog's name, ``{same_service}``: that of any pyiceberg
# catalog whose URI is this service's catalog), and why: the program gets the run's
# credential and nothing that reaches Lockstep as exec or its caller does.
INHERITED_CREDENTIALS: Mapping[str, str] = {
    "LOCKSTEP_TOKEN": "the lockstep CLI's bearer token: exec's own (admin, or the job's)",
    "LOCKSTEP_HOME": "the coordinator the CLI reaches; an embedded store's is its database",
    "LOCKSTEP_SERVICE_*": "a service's settings: its store's URL (a database password), "
    "its metrics token, its token file",
    "LOCKSTEP_CATALOG_*": "an outer exec's run catalog, its credential included",
    "PYICEBERG_CATALOG__{run}__*": "the settings of a pyiceberg catalog named as the run's "
    "(a token, an OAuth credential, headers), which pyiceberg would merge with the run's",
    "PYICEBERG_CATALOG__{same_service}__*": "a pyiceberg catalog of this service, with the "
    "token or credential of whoever set it",
}
_PYICEBERG_URI = re.compile(r"PYICEBERG_CATALOG__(.+)__URI", re.IGNORECASE)
_LINE = re.compile(r"^\s*([^\s=#]+)\s*[\s=]\s*(.*?)\s*$")


@dataclass(frozen=True)
class RunCatalog:
    """One run's catalog as a program reaches it."""

    name: str
    uri: str
    token: str | None
    warehouse: str
    prefix: str


@dataclass(frozen=True)
class RunFacts:
    """One run's barrier, its window and its tables."""

    job_id: str
    barrier_id: int
    barrier_ts: datetime
    previous_id: int | None
    previous_ts: datetime | None
    sources: tuple[str, ...]
    sinks: tuple[str, ...]


def plain_variables(facts: RunFacts, catalog: RunCatalog) -> dict[str, str]:
    """The ``LOCKSTEP_*`` variables of :data:`VARIABLES`."""
    previous, before = facts.previous_id, facts.previous_ts
    found = {
        "LOCKSTEP_JOB": facts.job_id,
        "LOCKSTEP_BARRIER": str(facts.barrier_id),
        "LOCKSTEP_BARRIER_TS": facts.barrier_ts.isoformat(),
        "LOCKSTEP_BARRIER_TS_MS": str(_millis(facts.barrier_ts)),
        "LOCKSTEP_PREVIOUS_BARRIER": "" if previous is None else str(previous),
        "LOCKSTEP_PREVIOUS_BARRIER_TS": "" if before is None else before.isoformat(),
        "LOCKSTEP_PREVIOUS_BARRIER_TS_MS": "" if before is None else str(_millis(before)),
        "LOCKSTEP_PREVIOUS_TAG": "" if previous is None else f"lockstep_b{previous}",
        "LOCKSTEP_SOURCES": ",".join(facts.sources),
        "LOCKSTEP_SINKS": ",".join(facts.sinks),
        "LOCKSTEP_CATALOG_NAME": catalog.name,
        "LOCKSTEP_CATALOG_URI": catalog.uri,
        "LOCKSTEP_CATALOG_TOKEN": catalog.token or "",
        "LOCKSTEP_CATALOG_WAREHOUSE": catalog.warehouse,
        "LOCKSTEP_CATALOG_PREFIX": catalog.prefix,
    }
    assert set(found) == set(VARIABLES)
    return found


def without_inherited_credentials(base: Mapping[str, str], catalog: RunCatalog) -> dict[str, str]:
    """``base`` without :data:`INHERITED_CREDENTIALS`.

    >>> env = {"LOCKSTEP_TOKEN": "t", "PYICEBERG_CATALOG__LOCKSTEP__TOKEN": "t", "HOME": "/h"}
    >>> without_inherited_credentials(env, RunCatalog("lockstep", "http://h/iceberg", None, "", ""))
    {'HOME': '/h'}
    """
    ours = catalog.uri.rstrip("/")
    names = {
        "run": [catalog.name],
        "same_service": [
            found.group(1)
            for name, value in base.items()
            if (found := _PYICEBERG_URI.fullmatch(name)) and value.rstrip("/") == ours
        ],
    }
    patterns = [p.upper() for pattern in INHERITED_CREDENTIALS for p in _each(pattern, names)]
    return {
        name: value
        for name, value in base.items()
        if not any(fnmatch.fnmatchcase(name.upper(), p) for p in patterns)
    }


def _each(pattern: str, names: Mapping[str, list[str]]) -> list[str]:
    """``pattern`` with its ``{placeholder}`` (if any) replaced by each of ``names``'."""
    for key, values in names.items():
        if f"{{{key}}}" in pattern:
            return [pattern.replace(f"{{{key}}}", value) for value in values]
    return [pattern]


def pyiceberg_variables(catalog: RunCatalog) -> dict[str, str]:
    """``PYICEBERG_CATALOG__<NAME>__*`` for ``load_catalog(name)``."""
    head = f"PYICEBERG_CATALOG__{catalog.name.upper()}__"
    found = {
        head + "TYPE": "rest",
        head + "URI": catalog.uri,
        head + "WAREHOUSE": catalog.warehouse,
    }
    if catalog.token:
        found[head + "TOKEN"] = catalog.token
    return found


def spark_defaults(
    catalog: RunCatalog, user: Mapping[str, str], jars: Sequence[str] = ()
) -> dict[str, str]:
    """``user``'s spark-defaults with the run's catalog added (the run's keys win), and
    ``jars`` appended to the user's."""
    key = f"spark.sql.catalog.{catalog.name}"
    merged = {k: v for k, v in user.items() if k != key and not k.startswith(key + ".")}
    merged["spark.sql.extensions"] = _appended(user.get("spark.sql.extensions"), EXTENSIONS)
    for jar in jars:
        merged["spark.jars"] = _appended(merged.get("spark.jars"), jar)
    merged.setdefault("spark.sql.defaultCatalog", catalog.name)
    merged[key] = CATALOG_CLASS
    merged[f"{key}.type"] = "rest"
    merged[f"{key}.uri"] = catalog.uri
    merged[f"{key}.warehouse"] = catalog.warehouse
    merged[f"{key}.cache-enabled"] = "false"  # each load sees the run's newest staging
    # unqualified names: the namespace a Lockstep table's one-part name lives in
    merged[f"{key}.default-namespace"] = user.get(f"{key}.default-namespace", DEFAULT_NAMESPACE)
    # the auth type said, not inferred (Iceberg's REST client warns when it guesses it, and
    # when it falls back to the default token endpoint): a bearer token is OAuth2's
    if catalog.token:
        merged[f"{key}.token"] = catalog.token
        merged[f"{key}.rest.auth.type"] = "oauth2"
        merged[f"{key}.oauth2-server-uri"] = catalog.uri.rstrip("/") + TOKENS_PATH
    else:
        merged[f"{key}.rest.auth.type"] = "none"
    return merged


def local_metastore(
    user: Mapping[str, str], user_dir: Path | None, state_dir: Path
) -> dict[str, str]:
    """Settings that keep a program's local metastore in ``state_dir`` (exec's folder, one
    per exec process) instead of the working directory, where two Spark programs started in
    one folder would share Derby's ``metastore_db`` (one JVM at a time can open it: the
    other fails, or gets on only if Hive's retries outlast the first). Nothing of a job
    lives there (its tables are the run's catalog's), so:

    - the session catalog in memory (``spark-sql`` and a PySpark app then start no Derby);
    - its default warehouse in ``state_dir``;
    - Derby's home in ``state_dir``, for a program that enables Hive support itself
      (dbt-spark's ``session`` method).

    The user's own setting of each wins, and a ``hive-site.xml`` of theirs (a metastore
    they chose) leaves all three alone.

    >>> found = local_metastore({}, None, Path("/s"))
    >>> found["spark.sql.catalogImplementation"], found["spark.driver.extraJavaOptions"]
    ('in-memory', '-Dderby.system.home=/s/derby')
    """
    if user_dir is not None and (user_dir / HIVE_SITE).exists():
        return {}
    found = {}
    if "spark.sql.catalogImplementation" not in user:
        found["spark.sql.catalogImplementation"] = "in-memory"
    if "spark.sql.warehouse.dir" not in user:
        found["spark.sql.warehouse.dir"] = str(state_dir / "spark-warehouse")
    options = user.get("spark.driver.extraJavaOptions", "")
    if "-Dderby.system.home=" not in options:
        home = f"-Dderby.system.home={state_dir / 'derby'}"
        home = f'"{home}"' if any(c.isspace() for c in home) else home
        found["spark.driver.extraJavaOptions"] = f"{options} {home}".strip()
    return found


def spark_master(
    command: Sequence[str], user: Mapping[str, str], environ: Mapping[str, str]
) -> str:
    """The master a Spark program run as ``command`` gets, as ``spark-submit`` picks it:
    ``--master`` (or ``--conf spark.master=``) on its command line, else the defaults'
    ``spark.master``, else ``$MASTER``, else Spark's ``local[*]``.

    >>> spark_master(["spark-sql", "--master", "yarn", "-f", "x.sql"], {}, {})
    'yarn'
    >>> spark_master(["spark-sql", "-f", "x.sql"], {}, {})
    'local[*]'
    """
    words = list(command)
    for i, word in enumerate(words):
        following = words[i + 1] if i + 1 < len(words) else ""
        if word == "--master" and following:
            return following
        if word.startswith("--master="):
            return word.split("=", 1)[1]
        if word in ("--conf", "-c") and following.startswith("spark.master="):
            return following.split("=", 1)[1]
    return user.get("spark.master") or environ.get("MASTER") or "local[*]"


def loopback_variables(
    command: Sequence[str], user: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, str]:
    """``SPARK_LOCAL_IP=127.0.0.1`` for a program whose Spark runs in local mode, so its
    driver (and UI) binds loopback instead of the first non-loopback address Spark finds
    (with a warning each run, where the host name resolves to loopback). Nothing when the
    user chose an address (``$SPARK_LOCAL_IP``, ``spark.driver.host`` or
    ``spark.driver.bindAddress``) or a cluster's master: its executors must reach the
    driver."""
    chosen = LOCAL_IP_ENV in environ or any(
        key in user for key in ("spark.driver.host", "spark.driver.bindAddress")
    )
    if chosen or not spark_master(command, user, environ).startswith("local"):
        return {}
    return {LOCAL_IP_ENV: LOOPBACK}


def user_conf_dir(environ: Mapping[str, str]) -> Path | None:
    """The Spark configuration folder the user would have had: ``$SPARK_CONF_DIR``, else
    ``$SPARK_HOME/conf`` (None: neither exists)."""
    if environ.get("SPARK_CONF_DIR"):
        return Path(environ["SPARK_CONF_DIR"])
    if environ.get("SPARK_HOME"):
        found = Path(environ["SPARK_HOME"]) / "conf"
        return found if found.is_dir() else None
    return None


def read_defaults(path: Path) -> dict[str, str]:
    """A ``spark-defaults.conf``'s settings (``key value`` or ``key=value`` lines)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigurationError(f"cannot read your Spark defaults {path}: {e}") from e
    found = {}
    for line in text.splitlines():
        matched = _LINE.match(line)
        if matched and not line.lstrip().startswith("#"):
            found[matched.group(1)] = matched.group(2)
    return found


def write_conf_dir(folder: Path, settings: Mapping[str, str], user_dir: Path | None) -> None:
    """``folder`` as a Spark configuration folder: ``settings`` as its defaults (readable
    by the owner alone: they hold the token), the user's other files linked."""
    folder.mkdir(parents=True, exist_ok=True)
    if user_dir is not None and user_dir.is_dir() and user_dir.resolve() != folder.resolve():
        for entry in user_dir.iterdir():
            link = folder / entry.name
            if entry.name != DEFAULTS_FILE and not link.exists():
                link.symlink_to(entry.resolve())
    defaults = folder / DEFAULTS_FILE
    text = "".join(f"{k} {v}\n" for k, v in sorted(settings.items()))
    defaults.touch(mode=0o600)
    defaults.write_text(text, encoding="utf-8")


def program_environment(
    run: OpenRun,
    state_dir: Path,
    base: Mapping[str, str],
    jars: Sequence[str] = (),
    command: Sequence[str] = (),
) -> dict[str, str]:
    """``base`` (exec's own environment, less :data:`INHERITED_CREDENTIALS`) with the run's
    catalog handed to the program ``command`` in every way above. ``state_dir`` is exec's
    folder: ``state_dir/conf`` becomes the program's ``SPARK_CONF_DIR``, whose
    ``spark.jars`` get the Iceberg runtime and ``jars`` (what the catalog needs:
    ``catalog_jars``), and Spark's local metastore lives beside it (:func:`local_metastore`)."""
    user_dir = user_conf_dir(base)
    user = read_defaults(user_dir / DEFAULTS_FILE) if user_dir is not None else {}
    runtime = iceberg_jar()
    every = [*([runtime] if runtime else []), *jars]
    settings = spark_defaults(run.catalog, user, every)
    settings.update(local_metastore(user, user_dir, state_dir))
    conf_dir = state_dir / "conf"
    write_conf_dir(conf_dir, settings, user_dir)
    env = without_inherited_credentials(base, run.catalog)
    env["SPARK_CONF_DIR"] = str(conf_dir)
    env.update(loopback_variables(command, user, base))
    env.update(pyiceberg_variables(run.catalog))
    env.update(plain_variables(run.facts, run.catalog))
    return env


def catalog_jars(uri: str, token: str | None) -> list[str]:
    """The jars a Spark program needs for the served catalog at ``uri`` beyond Iceberg's
    runtime: the AWS bundle when its config names S3FileIO (an object-store warehouse)."""
    from lockstep.barrier.iceberg.catalog import IcebergCatalog

    served = {"type": "rest", "uri": uri, **({"token": token} if token else {})}
    return IcebergCatalog.from_mapping(served).spark_jars()


def iceberg_jar() -> str | None:
    """The Iceberg Spark runtime jar Lockstep's own Spark uses (None: not installed; the
    user's ``spark.jars.packages`` or cluster must bring it)."""
    from lockstep.barrier.runtime.spark_session import find_iceberg_runtime_jar

    try:
        return str(find_iceberg_runtime_jar())
    except ConfigurationError:
        return None


def _appended(existing: str | None, value: str) -> str:
    items = [x for x in (existing or "").split(",") if x.strip()]
    return ",".join(items if value in items else [*items, value])


def _millis(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)
