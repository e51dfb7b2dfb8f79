"""Every setting the code reads is documented, in settings.py and in the README."""

import re
from pathlib import Path

import pytest

from modalscope.settings import DOCUMENTED, Settings, SettingsError

ROOT = Path(__file__).resolve().parents[1]


def test_every_variable_read_by_the_code_is_documented():
    used = set()
    for folder in ("modalscope", "app", "core", "ingest", "models", "migrations"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"MODALSCOPE_[A-Z_]+[A-Z]", path.read_text()))
    readme = (ROOT / "README.md").read_text()
    assert used, "the scan found nothing: the test is broken"
    for name in sorted(used | set(DOCUMENTED)):
        assert name in DOCUMENTED, f"{name} is read but not in settings.DOCUMENTED"
        assert f"`{name}`" in readme, f"{name} is not in README.md's settings table"


def test_defaults_and_parsing():
    s = Settings.from_env({})
    assert s.database_url == "sqlite:///modalscope.db" and s.otlp_http_port == 4318
    assert s.otlp_grpc_port == 4317 and s.port == 8050 and s.settle_seconds == 5
    assert s.max_request_bytes == 20 * 1024 * 1024 and not s.debug
    s = Settings.from_env({"MODALSCOPE_EMBED_ORIGINS": "https://a.example, https://b.example  https://c",
                           "MODALSCOPE_DEBUG": "1", "MODALSCOPE_SETTLE_SECONDS": "0.5"})
    assert s.embed_origins == ("https://a.example", "https://b.example", "https://c")
    assert s.debug and s.settle_seconds == 0.5


@pytest.mark.parametrize("name,value", [("MODALSCOPE_PORT", "eighty"), ("MODALSCOPE_SETTLE_SECONDS", "-1"),
                                        ("MODALSCOPE_MAX_REQUEST_BYTES", "10")])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})
