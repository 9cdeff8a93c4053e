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
