"""Service settings: file < environment < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.errors import ConfigurationError
from lockstep.service.auth import Role, load_tokens

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
    tokens.write_text("# comment\nadmin a-token-0123456789\nread r-token-0123456789\n")
    tokens.chmod(0o600)
    assert load_tokens(tokens) == {
        "a-token-0123456789": Role.ADMIN,
        "r-token-0123456789": Role.READ,
    }
    tokens.write_text("superuser s3cr3t-value\n")
    with pytest.raises(ConfigurationError, match=r"tokens:1: expected 'ROLE TOKEN'") as e:
        load_tokens(tokens)
    assert "s3cr3t-value" not in str(e.value)  # a token is never echoed
    tokens.write_text("\n")
    with pytest.raises(ConfigurationError, match="no tokens"):
        load_tokens(tokens)
