"""Settings: OLLAMA_HOST by Ollama's own rules, and every wrong setting as one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.config import (
    ListenAddress,
    SettingsError,
    load_settings,
    ollama_base_url,
    parse_listen,
    parse_ollama_host,
    prepare_data_dir,
)

# Every case of Ollama's envconfig TestHost (envconfig/config_test.go), plus docs/ollama-api.md §10.
OLLAMA_HOST_CASES = [
    ("", "http://127.0.0.1:11434"),
    ("1.2.3.4", "http://1.2.3.4:11434"),
    (":1234", "http://:1234"),
    ("1.2.3.4:1234", "http://1.2.3.4:1234"),
    ("example.com", "http://example.com:11434"),
    ("example.com:1234", "http://example.com:1234"),
    (":0", "http://:0"),
    (":66000", "http://:11434"),
    (":-1", "http://:11434"),
    ("[::1]", "http://[::1]:11434"),
    ("[::]", "http://[::]:11434"),
    ("::1", "http://[::1]:11434"),
    ("[::1]:1337", "http://[::1]:1337"),
    (" 1.2.3.4 ", "http://1.2.3.4:11434"),
    ('"1.2.3.4"', "http://1.2.3.4:11434"),
    (' " 1.2.3.4 " ', "http://1.2.3.4:11434"),
    ("'1.2.3.4'", "http://1.2.3.4:11434"),
    ("http://1.2.3.4", "http://1.2.3.4:80"),
    ("http://1.2.3.4:4321", "http://1.2.3.4:4321"),
    ("https://1.2.3.4", "https://1.2.3.4:443"),
    ("https://1.2.3.4:4321", "https://1.2.3.4:4321"),
    ("https://example.com/ollama", "https://example.com:443/ollama"),
    # docs/ollama-api.md §10 beyond the Go test table
    ("ollama.com", "https://ollama.com:443"),
    ("0.0.0.0", "http://0.0.0.0:11434"),  # kept for binding
    ("1.2.3.4:abc", "http://1.2.3.4:11434"),  # invalid port → default
    ("http://1.2.3.4:99999", "http://1.2.3.4:80"),  # invalid port → the scheme's default
    ("http://1.2.3.4/", "http://1.2.3.4:80"),
    ("::ffff:1.2.3.4", "http://1.2.3.4:11434"),  # Go prints IPv4-mapped addresses as IPv4
]


@pytest.mark.parametrize(("value", "expected"), OLLAMA_HOST_CASES)
def test_ollama_host_follows_ollamas_rules(value: str, expected: str) -> None:
    assert str(parse_ollama_host(value)) == expected


def test_none_is_the_default() -> None:
    assert str(parse_ollama_host(None)) == "http://127.0.0.1:11434"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:8080", "http://127.0.0.1:8080"),
        ("[::]", "http://[::1]:11434"),
        ("::", "http://[::1]:11434"),
        (":1234", "http://127.0.0.1:1234"),  # empty host binds everything; dial loopback (as the Python client)
        ("https://example.com/ollama", "https://example.com:443/ollama"),
        ("", "http://127.0.0.1:11434"),
    ],
)
def test_connectable_url_maps_bind_addresses_to_loopback(value: str, expected: str) -> None:
    assert ollama_base_url(value) == expected


def test_unsupported_scheme_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="scheme 'unix' is not supported"):
        ollama_base_url("unix:///tmp/ollama.sock")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:11435", ListenAddress("127.0.0.1", 11435)),
        ("[::1]:8080", ListenAddress("::1", 8080)),
        ("localhost:0", ListenAddress("localhost", 0)),
    ],
)
def test_listen_parses(value: str, expected: ListenAddress) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["11435", "127.0.0.1", ":11435", "127.0.0.1:port", "127.0.0.1:70000", "::1:80", ""])
def test_bad_listen_is_one_clear_line(value: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse_listen(value)
    message = str(err.value)
    assert "\n" not in message and "--listen" in message


def test_defaults(tmp_path: Path) -> None:
    s = load_settings([], {})
    assert s.ollama_url == "http://127.0.0.1:11434"
    assert str(s.listen) == "127.0.0.1:11435"
    assert s.interval_s == 1.0 and s.record_text is False and s.demo is False
    assert s.data_dir.name == "phasewatch"
    assert s.samples_retention_days == 7 and s.requests_retention_days == 90


def test_environment_and_options(tmp_path: Path) -> None:
    env = {
        "OLLAMA_HOST": "0.0.0.0:9999",
        "PHASEWATCH_LISTEN": "127.0.0.1:1234",
        "PHASEWATCH_DATA": str(tmp_path),
        "PHASEWATCH_RECORD_TEXT": "1",
        "PHASEWATCH_INTERVAL": "2.5",
        "PHASEWATCH_SAMPLES_DAYS": "3",
        "PHASEWATCH_REQUESTS_DAYS": "10",
        "PHASEWATCH_MAX_DB_MB": "64",
    }
    s = load_settings([], env)
    assert (s.ollama_url, str(s.listen), s.data_dir, s.record_text) == ("http://127.0.0.1:9999", "127.0.0.1:1234", tmp_path, True)
    assert (s.interval_s, s.samples_retention_days, s.requests_retention_days, s.max_db_bytes) == (2.5, 3, 10, 64 << 20)
    s = load_settings(
        [
            "--ollama",
            "http://10.0.0.2:11434",
            "--listen",
            "[::1]:5",
            "--data",
            str(tmp_path / "x"),
            "--interval",
            "0.5",
            "--demo",
            "--samples-days",
            "1",
            "--requests-days",
            "30",
            "--ollama-pids",
            "10,11",
        ],
        env,
    )
    assert s.ollama_url == "http://10.0.0.2:11434" and str(s.listen) == "[::1]:5"
    assert s.data_dir == tmp_path / "x" and s.interval_s == 0.5 and s.demo is True
    assert s.samples_retention_days == 1 and s.requests_retention_days == 30 and s.ollama_pids == (10, 11)
    assert s.record_text is True  # from the environment; the flag only turns it on


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--interval", "abc"], {}, "--interval 'abc' is not a number"),
        (["--interval", "0"], {}, "--interval '0' is out of range"),
        (["--interval", "nan"], {}, "out of range"),
        (["--listen", "nope"], {}, "is not HOST:PORT"),
        ([], {"PHASEWATCH_LISTEN": "1.2.3.4"}, "PHASEWATCH_LISTEN"),
        ([], {"PHASEWATCH_RECORD_TEXT": "maybe"}, "PHASEWATCH_RECORD_TEXT='maybe' is not a yes/no value"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--samples-days", "-1"], {}, "--samples-days '-1' is out of range"),
        (["--ollama-pids", "a,b"], {}, "--ollama-pids"),
        (["--data", " "], {}, "--data/PHASEWATCH_DATA is empty"),
        ([], {"PHASEWATCH_INTERVAL": "fast"}, "PHASEWATCH_INTERVAL 'fast' is not a number"),
        ([], {"PHASEWATCH_MAX_DB_MB": "0"}, "PHASEWATCH_MAX_DB_MB '0' is out of range"),
        (["--ollama", "ftp://host"], {}, "scheme 'ftp' is not supported"),
        ([], {"OLLAMA_HOST": "127.0.0.1:11435"}, "is this collector's own --listen address 127.0.0.1:11435"),
        (["--ollama", "localhost:9000", "--listen", "0.0.0.0:9000"], {}, "own --listen address"),
    ],
)
def test_wrong_settings_are_one_clear_line(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(argv, env)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message


def test_same_port_elsewhere_is_not_a_loop() -> None:
    s = load_settings(["--ollama", "http://10.0.0.2:11435"], {})
    assert s.ollama_url == "http://10.0.0.2:11435" and s.listen.port == 11435


def test_data_dir_checks(tmp_path: Path) -> None:
    prepare_data_dir(tmp_path / "new" / "deeper")
    assert (tmp_path / "new" / "deeper").is_dir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(SettingsError, match=r"cannot be created|is not a folder"):
        prepare_data_dir(a_file)
    with pytest.raises(SettingsError, match="cannot be created"):
        prepare_data_dir(a_file / "below")
