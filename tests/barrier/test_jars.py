"""Jars by Maven coordinates (barrier/jars.py): fetched once, checked, used offline after.

A real HTTP server on loopback stands in for Maven Central (``$LOCKSTEP_MAVEN_REPOSITORY``),
serving a Maven layout from a temporary folder.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from lockstep.barrier import jars
from lockstep.barrier.jars import (
    CACHE_ENV,
    REPOSITORY_ENV,
    FetchError,
    MavenArtifact,
    MissingJarError,
    fetch_artifact,
    iceberg_runtime_key,
    jar_path,
    require_jar,
)
from lockstep.cli.main import main
from lockstep.errors import ConfigurationError

CONTENT = b"PK\x03\x04 a jar's bytes"


@pytest.fixture
def repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Maven repository served on loopback; its folder (put files in it)."""
    root = tmp_path / "repo"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(REPOSITORY_ENV, f"http://127.0.0.1:{server.server_port}/")
    try:
        yield root
    finally:
        server.shutdown()
        server.server_close()


def _artifact(sha256: str | None = None) -> MavenArtifact:
    return MavenArtifact(
        "org.example", "thing", "1.2", sha256 or hashlib.sha256(CONTENT).hexdigest()
    )


def _publish(root: Path, artifact: MavenArtifact, content: bytes = CONTENT) -> None:
    folder = root / "org/example/thing/1.2"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / artifact.file_name).write_bytes(content)


def test_a_jar_is_downloaded_checked_and_then_used_offline(
    repository: Path, tmp_path: Path
) -> None:
    artifact = _artifact()
    _publish(repository, artifact)
    said: list[str] = []
    got = fetch_artifact(artifact, tmp_path / "cache", said.append)
    assert got.read_bytes() == CONTENT
    assert said[0].startswith("fetching org.example:thing:1.2 from http://127.0.0.1:")
    (repository / "org/example/thing/1.2" / artifact.file_name).unlink()  # Maven is gone
    assert fetch_artifact(artifact, tmp_path / "cache", said.append) == got
    assert len(said) == 2  # the second time: no download, nothing said


def test_a_download_with_another_checksum_is_refused_and_leaves_nothing(
    repository: Path, tmp_path: Path
) -> None:
    artifact = _artifact()
    _publish(repository, artifact, b"something else")
    with pytest.raises(FetchError, match="not the pinned"):
        fetch_artifact(artifact, tmp_path / "cache", lambda _: None)
    assert list((tmp_path / "cache").iterdir()) == []  # no jar, no partial file


def test_a_missing_artifact_says_what_and_how_to_get_it_otherwise(
    repository: Path, tmp_path: Path
) -> None:
    with pytest.raises(FetchError, match=r"cannot download org.example:thing:1.2 .*404") as e:
        fetch_artifact(_artifact(), tmp_path / "cache", lambda _: None)
    assert REPOSITORY_ENV in str(e.value)
    assert "copy the file to" in str(e.value)


def test_a_jar_not_fetched_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(MissingJarError, match=r"run `lockstep fetch iceberg-spark-3.5`") as e:
        require_jar("iceberg-spark-3.5")
    assert "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2" in str(e.value)
    assert jar_path("postgresql") == tmp_path / "jars" / "postgresql-42.7.14.jar"


def test_each_spark_gets_the_runtime_built_for_it() -> None:
    assert iceberg_runtime_key("3.5.9") == "iceberg-spark-3.5"
    assert iceberg_runtime_key("4.0.5") == "iceberg-spark-4.0"
    with pytest.raises(ConfigurationError, match=r"no Iceberg runtime pinned for Spark 3.4.1"):
        iceberg_runtime_key("3.4.1")


def test_every_pinned_jar_names_a_sha256() -> None:
    for key, jar in jars.JARS.items():
        assert len(jar.artifact.sha256) == 64, key
        int(jar.artifact.sha256, 16)


def test_the_command_lists_and_fetches(
    repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    artifact = _artifact()
    _publish(repository, artifact)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setitem(jars.JARS, "thing", jars.Jar(artifact, "a test jar"))
    assert main(["fetch", "--list"]) == 0
    assert "thing" in capsys.readouterr().out
    assert main(["fetch", "thing"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "cache" / "jars" / artifact.file_name)
    assert "fetching org.example:thing:1.2" in err
    assert main(["fetch", "nothing"]) == 2
    assert "no jar called 'nothing'" in capsys.readouterr().err
