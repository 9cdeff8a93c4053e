"""The jars Lockstep puts on a JVM, by their Maven coordinates: pinned here, fetched once.

Every jar comes from Maven Central (or the mirror ``$LOCKSTEP_MAVEN_REPOSITORY`` names)
by its coordinates, checked against the sha256 pinned below, into Lockstep's cache
(``$LOCKSTEP_CACHE/jars``, else ``$XDG_CACHE_HOME/lockstep/jars``, else
``~/.cache/lockstep/jars``). A jar in the cache is used as it is, offline. ``lockstep fetch``
fetches what an installation needs; a Spark session whose jar is missing fails saying that
command. A user with jars of their own sets ``[spark] jars`` (or ``spark.jars``), and
nothing here is used for those.

A download goes to a temporary file beside its destination and is renamed only once its
sha256 is the pinned one: a half-written or tampered jar never appears under its name.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import ConfigurationError

REPOSITORY_ENV = "LOCKSTEP_MAVEN_REPOSITORY"
CACHE_ENV = "LOCKSTEP_CACHE"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
TIMEOUT_S = 60.0  # per network read: a network that accepts and never answers fails
ICEBERG_VERSION = "1.10.2"


@dataclass(frozen=True)
class MavenArtifact:
    """One file of Maven Central, by coordinates, with the sha256 it must have."""

    group: str
    name: str
    version: str
    sha256: str
    extension: str = "jar"

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}.{self.extension}"

    def url(self) -> str:
        folder = f"{self.group.replace('.', '/')}/{self.name}/{self.version}"
        return f"{repository()}/{folder}/{self.file_name}"


def repository() -> str:
    """Where downloads come from: Maven Central, or ``$LOCKSTEP_MAVEN_REPOSITORY``."""
    return (os.environ.get(REPOSITORY_ENV) or MAVEN_CENTRAL).rstrip("/")


@dataclass(frozen=True)
class Jar:
    """A jar Lockstep uses, and what for."""

    artifact: MavenArtifact
    purpose: str


def _iceberg(name: str, sha256: str, version: str = ICEBERG_VERSION) -> MavenArtifact:
    return MavenArtifact("org.apache.iceberg", name, version, sha256)


# The one place versions are pinned. The 3.5 runtime is the jar the project used before
# it came from Maven Central (byte for byte).
JARS: dict[str, Jar] = {
    "iceberg-spark-3.5": Jar(
        _iceberg(
            "iceberg-spark-runtime-3.5_2.12",
            "c562d482dcd16b666e808b755469fbc4b2604284b41622c9d87e2c02b7cc6c5f",
        ),
        "Apache Iceberg for Spark 3.5 (Scala 2.12)",
    ),
    "iceberg-spark-4.0": Jar(
        _iceberg(
            "iceberg-spark-runtime-4.0_2.13",
            "7124a5da756f69c815f3f778691167ed00dfd813dde2c26025278aa35f35abb8",
        ),
        "Apache Iceberg for Spark 4.0 (Scala 2.13)",
    ),
    "iceberg-aws-bundle": Jar(
        _iceberg(  # 1.10.2's bundle is not on Maven Central; the AWS SDK of 1.10.1 is
            "iceberg-aws-bundle",
            "86bf20892ea5b4c17688f19b075399885f6aa5303f6b2dc9f491e76ceef9633b",
            version="1.10.1",
        ),
        "the AWS SDK for Iceberg's S3FileIO (an s3:// warehouse)",
    ),
    "postgresql": Jar(
        MavenArtifact(
            "org.postgresql",
            "postgresql",
            "42.7.14",
            "73914527305a40cce504b0d3d90b23caf565136912d607ae8ae7c5895512332c",
        ),
        "the PostgreSQL JDBC driver (Iceberg's JDBC catalog on PostgreSQL)",
    ),
}
# Spark's minor version -> the Iceberg runtime built for it (they are not interchangeable)
ICEBERG_FOR_SPARK = {"3.5": "iceberg-spark-3.5", "4.0": "iceberg-spark-4.0"}

Say = Callable[[str], None]


class MissingJarError(ConfigurationError):
    """A jar Lockstep needs is not in its cache."""

    def __init__(self, key: str, path: Path) -> None:
        jar = JARS[key]
        super().__init__(
            f"{jar.purpose} is not fetched: run `lockstep fetch {key}` (downloads "
            f"{jar.artifact.coordinates} from Maven Central into {path.parent}), or name "
            "your own jar in [spark] jars"
        )
        self.key = key
        self.path = path


class FetchError(ConfigurationError):
    """A download that failed or did not match its pinned checksum."""


def cache_dir() -> Path:
    """Lockstep's download cache (jars under ``jars/``)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lockstep"


def jar_path(key: str) -> Path:
    """Where jar ``key`` is (or would be) in the cache."""
    return cache_dir() / "jars" / JARS[key].artifact.file_name


def require_jar(key: str) -> Path:
    """Jar ``key``'s file; MissingJarError (saying how to fetch it) if it is not there."""
    path = jar_path(key)
    if not path.is_file():
        raise MissingJarError(key, path)
    return path


def iceberg_runtime_key(spark_version: str) -> str:
    """The key of the Iceberg runtime for Spark ``spark_version`` (``3.5.9``, ``4.0.5``)."""
    minor = ".".join(spark_version.split(".")[:2])
    try:
        return ICEBERG_FOR_SPARK[minor]
    except KeyError:
        known = ", ".join(ICEBERG_FOR_SPARK)
        raise ConfigurationError(
            f"Lockstep has no Iceberg runtime pinned for Spark {spark_version} (it has one for "
            f"Spark {known}): install one of those, or name your own jar in [spark] jars"
        ) from None


def fetch_jars(keys: Iterable[str], say: Say = print) -> list[Path]:
    """Each jar of ``keys`` in the cache: kept if there, else downloaded and checked."""
    return [fetch_artifact(JARS[key].artifact, cache_dir() / "jars", say) for key in keys]


def fetch_artifact(
    artifact: MavenArtifact, folder: Path, say: Say = print, *, timeout_s: float = TIMEOUT_S
) -> Path:
    """``artifact`` in ``folder``: kept if there, else downloaded, its sha256 checked."""
    destination = folder / artifact.file_name
    if destination.is_file():
        return destination
    folder.mkdir(parents=True, exist_ok=True)
    url = artifact.url()
    say(f"fetching {artifact.coordinates} from {repository()} ...")
    started = time.monotonic()
    fd, part = tempfile.mkstemp(dir=folder, prefix=f".{artifact.file_name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as got:
            while chunk := got.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != artifact.sha256:
            raise FetchError(
                f"{url} has sha256 {digest.hexdigest()}, not the pinned {artifact.sha256}: "
                "not used (a mirror serving another file?)"
            )
        os.replace(part, destination)
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(
            f"cannot download {artifact.coordinates} ({url}): {e}; on a machine without "
            f"Maven Central, set {REPOSITORY_ENV} to a mirror, or copy the file to "
            f"{destination}"
        ) from e
    finally:
        if os.path.exists(part):
            os.unlink(part)
    size = destination.stat().st_size / 1e6
    say(f"  {size:.1f} MB in {time.monotonic() - started:.1f} s: {destination}")
    return destination
