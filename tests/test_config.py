"""The config file: lookup order, per-key overrides, precedence, and errors naming file and line."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import json_events
from tests.support.cli import one_error_line
from tests.support.cli import tasklock


@pytest.fixture
def env(cli_env, tmp_path):
    return {**cli_env, "HOME": str(tmp_path / "home")}


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def acquired_event(result) -> dict:
    return next(e for e in json_events(result.stderr) if e["event"] == "acquired")


def test_store_and_defaults_from_the_config_file(env, tmp_path):
    db = tmp_path / "from-config.db"
    config = write(
        tmp_path / "tasklock.toml",
        f'store = "sqlite://{db}"\nttl = "45s"\n[keys."invoices:*"]\nttl = "5m"\n',
    )
    env = {**env, "TASKLOCK_CONFIG": str(config)}
    plain = tasklock("--log-format", "json", "run", "other", "--", "true", env=env)
    special = tasklock("--log-format", "json", "run", "invoices:nightly", "--", "true", env=env)
    assert plain.returncode == 0 and special.returncode == 0
    assert db.exists()

    def ttl_of(result):
        event = acquired_event(result)
        from datetime import datetime

        expires = datetime.fromisoformat(event["expires_at"].replace("Z", "+00:00"))
        return (expires - datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))).seconds

    assert 43 <= ttl_of(plain) <= 45
    assert 298 <= ttl_of(special) <= 300
    flag = tasklock(
        "--log-format", "json", "run", "invoices:x", "--ttl", "10s", "--", "true", env=env
    )
    assert 8 <= ttl_of(flag) <= 10  # flag > file


def test_lookup_order_flag_env_cwd_xdg(env, tmp_path):
    for name in ("flag", "env", "cwd", "xdg"):
        write(tmp_path / f"{name}.toml", f'store = "sqlite://{tmp_path}/{name}.db"\n')
    write(tmp_path / "work" / "tasklock.toml", f'store = "sqlite://{tmp_path}/cwd.db"\n')
    write(
        tmp_path / "config" / "tasklock" / "config.toml", f'store = "sqlite://{tmp_path}/xdg.db"\n'
    )

    def store_in_effect(*args, cwd=tmp_path / "work", extra=None):
        result = tasklock(*args, "doctor", env={**env, **(extra or {})}, cwd=cwd)
        line = next(x for x in result.stdout.splitlines() if x.split()[1] == "store")
        return line.split()[-1]

    assert store_in_effect(
        "--config",
        str(tmp_path / "flag.toml"),
        extra={"TASKLOCK_CONFIG": str(tmp_path / "env.toml")},
    ).endswith("flag.db")
    assert store_in_effect(extra={"TASKLOCK_CONFIG": str(tmp_path / "env.toml")}).endswith("env.db")
    assert store_in_effect().endswith("cwd.db")
    assert store_in_effect(cwd=tmp_path).endswith("xdg.db")
    assert store_in_effect(extra={"TASKLOCK_STORE": f"sqlite://{tmp_path}/envstore.db"}).endswith(
        "envstore.db"
    )  # TASKLOCK_STORE > file
    assert store_in_effect(
        "--store",
        f"sqlite://{tmp_path}/flagstore.db",
        extra={"TASKLOCK_STORE": "sqlite:///nope.db"},
    ).endswith("flagstore.db")


def test_doctor_names_the_config_file_in_effect(env, tmp_path):
    config = write(tmp_path / "c.toml", f'store = "sqlite://{tmp_path}/x.db"\n')
    result = tasklock("--config", str(config), "doctor", env=env)
    assert result.returncode == 0
    assert f"config       {config}" in result.stdout


@pytest.mark.parametrize(
    ("text", "line", "setting"),
    [
        ('store = "sqlite:///tmp/x.db"\nttl = "30x"\n', 2, "ttl"),
        ('ttl = "30s"\n\ncolour = "blue"\n', 3, "colour"),
        ('[keys."a:*"]\nwait = "soon"\n', 2, "wait"),
        ('[keys."a:*"]\nnote = "x"\n', 2, "note"),
        ("conflict-exit-code = 300\n", 1, "conflict-exit-code"),
    ],
)
def test_bad_settings_exit_78_naming_file_line_and_setting(env, tmp_path, text, line, setting):
    config = write(tmp_path / "bad.toml", text)
    result = tasklock("--config", str(config), "run", "a:b", "--", "true", env=env)
    assert result.returncode == 78
    message = one_error_line(result.stderr)
    assert f"{config}:{line}" in message and repr(setting) in message


def test_unparseable_and_missing_config_files(env, tmp_path):
    broken = write(tmp_path / "broken.toml", "store = \n")
    result = tasklock("--config", str(broken), "list", env=env)
    assert result.returncode == 78 and str(broken) in one_error_line(result.stderr)
    missing = tasklock("--config", str(tmp_path / "absent.toml"), "list", env=env)
    assert missing.returncode == 78 and "does not exist" in one_error_line(missing.stderr)


def test_conflict_exit_code_from_the_config(env, tmp_path):
    config = write(
        tmp_path / "c.toml",
        f'store = "sqlite://{tmp_path}/c.db"\n[keys."cron:*"]\nconflict-exit-code = 0\n',
    )
    env = {**env, "TASKLOCK_CONFIG": str(config)}
    holder = tasklock("run", "cron:x", "--hold-at-least", "30s", "--", "true", env=env)
    assert holder.returncode == 0
    assert tasklock("run", "cron:x", "--", "true", env=env).returncode == 0
    assert (
        tasklock("run", "cron:x", "--conflict-exit-code", "9", "--", "true", env=env).returncode
        == 9
    )
    listed = json.loads(tasklock("list", "--json", env=env).stdout)
    assert [entry["key"] for entry in listed] == ["cron:x"]
