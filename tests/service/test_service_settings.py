"""Service settings: file < environment < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.errors import ConfigurationError
from lockstep.service.auth import Grant, Role, load_tokens

pytest.importorskip("pydantic_settings")
from lockstep.service.settings import ServiceSettings


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "service.toml"
    config.write_text('store = "postgresql://db/lockstep"\nport = 9000\nsql_max_rows = 5\n')
    monkeypatch.setenv("LOCKSTEP_SERVICE_PORT", "9100")
    settings = ServiceSettings.load(config, sql_max_rows=7)
    assert settings.store == "postgresql://db/lockstep"  # from the file
    assert settings.port == 9100  # the environment beats the file
    assert settings.sql_max_rows == 7  # a flag beats both


def test_bad_settings(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text("port = 'not a port'\n")
    with pytest.raises(ConfigurationError, match="invalid service settings"):
        ServiceSettings.load(config)
    config.write_text("port = [\n")
    with pytest.raises(ConfigurationError, match="cannot read service config"):
        ServiceSettings.load(config)
    with pytest.raises(ConfigurationError, match="invalid service settings"):
        ServiceSettings.load(None, nonsense=1)


def test_token_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# comment\nadmin a-token-0123456789\nread r-token-0123456789\n"
        "job load,sum-amount j-token-0123456789\n"
    )
    tokens.chmod(0o600)
    assert load_tokens(tokens) == {
        "a-token-0123456789": Grant(Role.ADMIN),
        "r-token-0123456789": Grant(Role.READ),
        "j-token-0123456789": Grant(Role.JOB, frozenset({"load", "sum-amount"})),
    }
    tokens.write_text("superuser s3cr3t-value\n")
    with pytest.raises(ConfigurationError, match=r"tokens:1: expected 'admin TOKEN'") as e:
        load_tokens(tokens)
    assert "s3cr3t-value" not in str(e.value)  # a token is never echoed
    tokens.write_text("\n")
    with pytest.raises(ConfigurationError, match="no tokens"):
        load_tokens(tokens)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("job j-token-0123456789", "expected 'admin TOKEN'"),  # no jobs named
        ("job ,, j-token-0123456789", "name the jobs"),
        ("job bad/name j-token-0123456789", "invalid job name 'bad/name'"),
        ("admin load a-token-0123456789", "expected 'admin TOKEN'"),  # jobs on an admin
    ],
)
def test_a_job_grant_names_its_jobs(tmp_path: Path, line: str, says: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(line + "\n")
    tokens.chmod(0o600)
    with pytest.raises(ConfigurationError, match=says) as e:
        load_tokens(tokens)
    assert "0123456789" not in str(e.value)


def test_a_token_file_with_a_byte_order_mark_is_refused_by_name(tmp_path: Path) -> None:
    """#38 finding 13: a UTF-8 BOM (Windows editors) was refused as a bad role."""
    tokens = tmp_path / "tokens"
    tokens.write_bytes("\ufeffadmin a-token-0123456789\n".encode())
    tokens.chmod(0o600)
    with pytest.raises(ConfigurationError, match="byte order mark"):
        load_tokens(tokens)


def test_a_port_out_of_range_is_refused_not_wrapped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lockstep.cli.main import main

    # the operating system would bind 94036 % 65536 = 28500 and the service announce 94036
    with pytest.raises(SystemExit):
        main(["serve", "--port", "94036"])
    assert "argument --port: a TCP port is from 1 to 65535, not 94036" in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match=r"port: .*a TCP port is from 1 to 65535, not 0"):
        ServiceSettings.load(port=0)
    monkeypatch.setenv("LOCKSTEP_SERVICE_PORT", "94036")
    with pytest.raises(ConfigurationError, match="a TCP port is from 1 to 65535, not 94036"):
        ServiceSettings.load()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--store", "http://[::1", "tables"], "'http://[::1' is not a valid URL"),
        (["--store", "postgresql://etl:pw@[::1/x", "tables"], "'postgresql://etl:***@[::1/x'"),
        (["--store", "http://localhost:99999", "tables"], "Port out of range"),
        (["serve", "--store", "http://[::1"], "'http://[::1' is not a valid URL"),
        (["serve", "--store", "postgresql://h:port/db"], "is not a valid URL"),
        (["--store", "http://127.0.0.1:1,http://[::1", "tables"], "is not a valid URL"),
    ],
)
def test_a_malformed_store_url_is_a_clear_error(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from lockstep.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert said in err
    assert "Lockstep bug" not in err
    assert ":pw@" not in err


def test_serve_says_what_it_serves_where_to_whom_without_secrets(tmp_path: Path) -> None:
    from lockstep.service.banner import banner
    from lockstep.service.connections import ConnectionLimits

    token_file = tmp_path / "tokens"
    token_file.write_text(
        "admin admin-token-000000001\nread read-token-0000000001\njob a,b job-token-00000001\n"
    )
    settings = ServiceSettings.load(
        store="postgresql://etl:s3cret@db:5432/lockstep?sslpassword=x",
        host="::1",
        port=9000,
        token_file=token_file,
        barrier_interval_s=5,
        iceberg={"warehouse": "file:///srv/warehouse"},
        catalog={"type": "rest", "uri": "http://[::1]:9000/iceberg", "token": "tok-secret"},
    )
    said = banner(settings, load_tokens(token_file), ConnectionLimits(500, 10.0))
    lines = said.splitlines()
    assert lines[0] == "Lockstep coordinator on http://[::1]:9000"
    rows = {line.split("  ", 2)[1].strip(): line.split("  ", 2)[2].strip() for line in lines[1:]}
    assert rows["API"].startswith("http://[::1]:9000/v1/")
    assert rows["status page"] == "http://[::1]:9000/?token=TOKEN"
    assert rows["Iceberg REST"] == (
        "http://[::1]:9000/iceberg (warehouse file:///srv/warehouse, publish per-table)"
    )
    assert rows["metrics"] == "http://[::1]:9000/metrics"
    assert rows["auth"] == f"token file {token_file} (1 admin, 1 job, 1 read tokens)"
    assert rows["store"] == "postgresql://etl:***@db:5432/lockstep?sslpassword=***"
    assert rows["catalog"].startswith("rest catalog 'lockstep' at http://[::1]:9000/iceberg")
    assert rows["barriers"] == "issued every 5 s, at most 3 in flight (by one replica at a time)"
    assert rows["connections"] == "at most 500 open; a request must arrive within 10 s"
    assert rows["access log"].startswith("off")
    for secret in ("s3cret", "tok-secret", "token-0", "sslpassword=x"):
        assert secret not in said
    local = banner(ServiceSettings.load(store="sqlite:///x.db"), None, ConnectionLimits(9, 1.0))
    assert "auth         no token file: loopback callers only, each an admin" in local
    assert "Iceberg REST" not in local


def test_a_service_target_of_several_replicas_is_one_url_list() -> None:
    """``http://a:1,http://b:2`` names two replicas of one service (the crash harness's
    clients and the README's ``lockstep.connect`` use it): each URL is checked, none
    refused for the comma."""
    from lockstep.stores import normalize_store_url

    target = "http://127.0.0.1:8765,http://127.0.0.1:8766/"
    assert normalize_store_url(target) == "http://127.0.0.1:8765,http://127.0.0.1:8766"
