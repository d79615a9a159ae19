"""A host with several users: the SQLite store's files, config lookup, and what tasklock
keeps and prints (issue 24's findings, each through the real executable).

A second user is ``nobody`` (uid 65534), reached by running as root (CI runs as root); the
tests that need one are skipped otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.sqlite.entries import key_dir_name
from tests.support.cli import executable
from tests.support.cli import one_error_line
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

NOBODY = 65534
#: nobody's primary group: nobody is a member of it in the group database.
NOGROUP = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a second user (nobody) is reached only as root; this user cannot switch uid",
)
VICTIM = b"root-only secret\n"


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory every user can reach and write to, sticky like /tmp (pytest's tmp_path
    is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="tasklock-multi-user-", dir="/var/tmp"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_bytes(VICTIM)
    path.chmod(0o600)
    return path


#: Runs tasklock from this checkout in an interpreter the second user may execute (the
#: test's own may live in root's home, out of their reach).
_BOOT = (
    "import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]\n"
    "from tasklock_cli.cli.entry import main; main(sys.argv[1:])"
)


@functools.cache
def second_user_python() -> str | None:
    """An interpreter of this Python version that nobody may run, if there is one."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not os.path.exists(candidate):
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "import sqlite3"],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                capture_output=True,
                cwd="/",
            )
        except OSError:  # not theirs to execute
            continue
        if probe.returncode == 0:
            return candidate
    return None


def nobody_tasklock() -> list[str]:
    """The argv prefix that runs this checkout's tasklock as the second user."""
    python = second_user_python()
    if python is None:
        pytest.skip(
            f"no python{sys.version_info.major}.{sys.version_info.minor} that "
            "nobody may run (the test's own is out of their reach)"
        )
    root = str(Path(__file__).resolve().parent.parent)
    return [python, "-c", _BOOT, root, str(Path(typer.__file__).parent.parent)]


def as_nobody(args: list[str], env: dict[str, str], groups: tuple[int, ...] = (), **kwargs):
    """Run ``args`` as the second user (``tasklock`` as its first word: this checkout's)."""
    if args[0] == "tasklock":
        args = [*nobody_tasklock(), *args[1:]]
    kwargs.setdefault("cwd", "/")
    return subprocess.run(
        args,
        env=env,
        user=NOBODY,
        group=NOBODY,
        extra_groups=list(groups),
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def nobody_env(cli_env: dict[str, str], home: Path) -> dict[str, str]:
    """The second user's environment: a home of theirs (root's tmp_path is out of reach)."""
    home.mkdir(exist_ok=True)
    os.chown(home, NOBODY, NOBODY)
    return {
        **cli_env,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
    }


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def group_directory(base: Path, group: int, name: str = "team") -> Path:
    """A directory of ``group`` as the README's sharing section makes one: root's, the
    group's, 2770 (setgid)."""
    directory = base / name
    directory.mkdir()
    os.chown(directory, 0, group)
    directory.chmod(0o2770)
    return directory


# -- wake-up entries ----------------------------------------------------------------------


@needs_root
def test_planted_symlinks_and_files_beside_the_store_are_never_written(
    cli_env, shared_base, victim
):
    """A member of a shared store's group (here: nobody, in group nogroup) first makes
    X.db.waiters and X.db.holders and plants symlinks and a file named like tasklock's
    entries; root's run, waiting run and forced release write through none of them."""
    team = group_directory(shared_base, NOGROUP)
    db = team / "locks.db"
    url = f"sqlite://{db}?mode=0660"
    plant = (
        "import os, sys\n"
        "db, victim, key_dir = sys.argv[1:]\n"
        "for top in ('.waiters', '.holders'):\n"
        "    d = os.path.join(db + top, key_dir)\n"
        "    os.makedirs(d, mode=0o770)\n"
        "    os.chmod(db + top, 0o2770); os.chmod(d, 0o2770)\n"
        "w = os.path.join(db + '.waiters', key_dir)\n"
        "os.symlink(victim, os.path.join(w, '00000000000000000001.1.deadbeef'))\n"
        "with open(os.path.join(w, '00000000000000000002.1.deadbeef'), 'w') as f:\n"
        "    f.write('planted')\n"
        "for token in range(1, 6):\n"
        "    os.symlink(victim, os.path.join(db + '.holders', key_dir, str(token)))\n"
    )
    planted = as_nobody(
        [nobody_tasklock()[0], "-c", plant, str(db), str(victim), key_dir_name("k")], cli_env
    )
    assert planted.returncode == 0, planted.stderr
    env = {**cli_env, "TASKLOCK_STORE": url}
    key_dir = db.with_name("locks.db.waiters") / key_dir_name("k")
    planted_names = set(os.listdir(key_dir))
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(url, "k")
        waiter = start("run", "k", "--wait", "30s", "--", "true", env=env)
        # it registers in the waiters' directory: its FIFO, made as new.*, then renamed
        wait_until(lambda: {n for n in os.listdir(key_dir) if n[:4] != "new."} - planted_names)
        released = tasklock("release", "k", "--force", env=env)
        assert released.returncode == 0, released.stderr
        assert waiter.wait(timeout=30) == 0
        assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    finally:
        holder.kill()
        holder.wait()
    assert victim.read_bytes() == VICTIM
    planted_file = (
        db.with_name("locks.db.waiters") / key_dir_name("k") / ("00000000000000000002.1.deadbeef")
    )
    assert planted_file.read_text() == "planted"  # left alone, not removed


def published_entries(entry_dir: Path) -> list[Path]:
    """A key's waiter FIFOs, but not one still being made (renamed from "new.*" once open)."""
    if not entry_dir.is_dir():
        return []
    return [entry for entry in entry_dir.iterdir() if not entry.name.startswith("new.")]


def test_wake_up_entries_and_store_files_are_private(cli_env):
    """Under umask 022: directory 0700, database (and -wal, -shm) and entries 0600."""
    old = os.umask(0o022)
    try:
        holder = start("run", "k", "--", "sleep", "30", env=cli_env)
        state = Path(cli_env["XDG_STATE_HOME"]) / "tasklock"
        db = state / "locks.db"
        try:
            wait_until(db.exists)
            wait_for_holder(f"sqlite://{db}", "k")
            waiter = start("run", "k", "--wait", "30s", "--", "true", env=cli_env)
            entry_dir = Path(f"{db}.waiters") / key_dir_name("k")
            entry = wait_until(lambda: published_entries(entry_dir))[0]
            assert mode(state) == 0o700
            assert mode(Path(cli_env["XDG_STATE_HOME"])) == 0o700
            for name in ("locks.db", "locks.db-wal", "locks.db-shm"):
                assert mode(state / name) == 0o600, name
            assert mode(Path(f"{db}.waiters")) == 0o700
            assert mode(entry_dir) == 0o700
            assert stat.S_ISFIFO(os.lstat(entry).st_mode) and mode(entry) == 0o600
        finally:
            holder.terminate()
            holder.wait()
        assert waiter.wait(timeout=30) == 0
    finally:
        os.umask(old)


@needs_root
def test_a_group_shared_store_works_for_a_second_user_under_umask_022(cli_env, shared_base):
    group = 100  # "users"
    shared = shared_base / "team"
    shared.mkdir()
    os.chown(shared, 0, group)
    shared.chmod(0o2770)
    url = f"sqlite://{shared}/locks.db?mode=0660"
    env = {**cli_env, "TASKLOCK_STORE": url}
    old = os.umask(0o022)
    try:
        holder = start("run", "k", "--", "sleep", "30", env=env)
        try:
            wait_for_holder(url, "k")
            theirs = {**nobody_env(cli_env, shared_base / "nobody"), "TASKLOCK_STORE": url}
            waiter = subprocess.Popen(
                [*nobody_tasklock(), "run", "k", "--wait", "30s", "--", "true"],
                cwd="/",
                env=theirs,
                user=NOBODY,
                group=NOBODY,
                extra_groups=[group],
                umask=0o022,
                stderr=subprocess.PIPE,
                text=True,
            )
            entry_dir = Path(f"{shared}/locks.db.waiters") / key_dir_name("k")
            entry = wait_until(lambda: published_entries(entry_dir))[0]
            assert mode(shared / "locks.db") == 0o660
            assert mode(Path(f"{shared}/locks.db.waiters")) == 0o2770
            assert mode(entry) == 0o660
        finally:
            holder.terminate()
            holder.wait()
        assert waiter.wait(timeout=30) == 0, piped(waiter.stderr).read()
        doctor = as_nobody(["tasklock", "doctor"], theirs, groups=(group,))
        assert doctor.returncode == 0, doctor.stdout
        assert "ok    permissions  shared with group users" in doctor.stdout
    finally:
        os.umask(old)


class _Listing:
    """os.scandir's answer, read already: an iterator and a context manager, as the real one."""

    def __init__(self, entries: list[os.DirEntry]) -> None:
        self._left = iter(entries)

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> os.DirEntry:
        return next(self._left)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._left = iter(())


def _count_listed_entries(monkeypatch) -> list[int]:
    """From now on, the number of entries of each directory listing (os.listdir, and
    os.scandir, which glob and os.walk use)."""
    listed: list[int] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path: str | int = ".") -> list[str]:
        names = real_listdir(path)
        listed.append(len(names))
        return names

    def scandir(path: str | int = ".") -> _Listing:
        with real_scandir(path) as entries:
            found = list(entries)
        listed.append(len(found))
        return _Listing(found)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return listed


@pytest.mark.slow  # (thousands of entries)
def test_many_entries_beside_the_store_do_not_slow_a_release(tmp_path, monkeypatch):
    """Entries of other keys (or planted junk) are never listed by a release of a key:
    counted, not timed (listing 20,000 entries takes milliseconds, as a loaded machine's
    scheduler does)."""
    from tasklock_cli.stores.sqlite.waiting import LocalWakeups

    top = tmp_path / "w"
    waiter = LocalWakeups(top)
    assert waiter.register("k")
    for index in range(20_000):
        (top / f"{index:020d}.1.deadbeef").touch()
    releaser = LocalWakeups(top)
    listed = _count_listed_entries(monkeypatch)
    for _ in range(10):
        releaser.wake_one("other")
    releaser.wake_one("k")
    assert waiter.wait(0.5) is True
    assert sum(listed) < 100, f"11 releases listed {listed} entries"  # "k"'s FIFO, not 20,000
    waiter.leave()


# -- the store file -----------------------------------------------------------------------


def test_a_store_that_lost_its_lease_table_is_refused_not_made_again(cli_env, tmp_path):
    """The lease table dropped (its run ledger kept): made again, it would issue fencing
    tokens from 1 again, so the store is refused (78), saying why, and left as it is."""
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite://{db}"}
    for _ in range(2):
        assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE tasklock_leases")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    result = tasklock("run", "k", "--", "true", env=env)
    assert result.returncode == 78, result.stderr
    assert "run ledger but not its lease table" in one_error_line(result.stderr)
    assert db.read_bytes() == before


def test_a_lease_table_dropped_after_the_first_look_is_not_made_again(tmp_path):
    """The lease table dropped between the open's first look (refuse_foreign) and the
    making of what is missing (in its own write transaction): that making refuses too."""
    from tasklock_cli.errors import ConfigError
    from tasklock_cli.stores.sqlite.schema import RUNS_TABLE
    from tasklock_cli.stores.sqlite.schema import upgrade_steps

    conn = sqlite3.connect(tmp_path / "locks.db")
    conn.execute(f"CREATE TABLE {RUNS_TABLE} (key TEXT, fencing_token INTEGER)")
    with pytest.raises(ConfigError, match="run ledger but not its lease table"):
        upgrade_steps(conn, "locks.db")
    conn.close()


def test_tables_made_by_another_process_meanwhile_are_not_a_lost_lease_table(tmp_path):
    """The first look (outside any transaction) finds no lease table, and another process
    makes the tables before the look at the ledger: that is a first use racing ours, not a
    lost lease table (a clean-clone CI run's eight racing first users met it)."""
    from tasklock_cli.stores.sqlite.schema import RUNS_TABLE
    from tasklock_cli.stores.sqlite.schema import TABLE
    from tasklock_cli.stores.sqlite.schema import upgrade_steps

    path = tmp_path / "locks.db"
    ours = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None)

    def make_the_tables_meanwhile(statement: str) -> None:
        if statement == "PRAGMA user_version":  # (after the lease table's columns were read)
            other.execute("BEGIN")
            other.execute(f"CREATE TABLE {TABLE} (key TEXT)")
            other.execute(f"CREATE TABLE {RUNS_TABLE} (key TEXT)")
            other.execute("COMMIT")

    ours.set_trace_callback(make_the_tables_meanwhile)
    try:
        assert upgrade_steps(ours, "locks.db")  # (what it makes; the transaction reads again)
    finally:
        ours.close()
        other.close()


def _foreign_database(path: Path, tables: bool = True) -> bytes:
    conn = sqlite3.connect(path)
    if tables:
        conn.execute("CREATE TABLE accounts (name TEXT, balance INTEGER)")
        conn.execute("INSERT INTO accounts VALUES ('alice', 12)")
    conn.execute("PRAGMA user_version = 12")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("tables", [True, False])
def test_another_applications_database_is_refused_and_left_as_is(cli_env, tmp_path, tables):
    app_db = tmp_path / "app.db"
    before = _foreign_database(app_db, tables)
    result = tasklock("run", "--store", f"sqlite://{app_db}", "k", "--", "true", env=cli_env)
    assert result.returncode == 78
    assert "another application's database" in one_error_line(result.stderr)
    assert app_db.read_bytes() == before
    assert not Path(f"{app_db}-wal").exists()


def test_a_symlinked_store_path_is_refused(cli_env, tmp_path):
    app_db = tmp_path / "app.db"
    before = _foreign_database(app_db)
    link = tmp_path / "locks.db"
    link.symlink_to(app_db)
    for command in (["run", "k", "--", "true"], ["list"], ["history", "k"]):
        result = tasklock("--store", f"sqlite://{link}", *command, env=cli_env)
        assert result.returncode == 78, command
        assert "is a symlink" in one_error_line(result.stderr)
    assert app_db.read_bytes() == before
    doctor = tasklock("doctor", "--store", f"sqlite://{link}", env=cli_env)
    assert doctor.returncode != 0
    assert "fail  permissions" in doctor.stdout and "is a symlink" in doctor.stdout


@needs_root
def test_a_world_writable_store_made_by_another_user_is_refused(cli_env, shared_base):
    """Another user pre-creates a 0666 store holding a forged lease: refused, never used."""
    db = shared_base / "locks.db"
    url = f"sqlite://{db}"
    made = as_nobody(
        ["tasklock", "run", "--store", url, "k", "--", "true"],
        nobody_env(cli_env, shared_base / "nobody"),
    )
    assert made.returncode == 0, made.stderr
    db.chmod(0o666)  # (as nobody could: it is their file)
    before = db.read_bytes()
    result = tasklock("run", "--store", url, "k", "--", "true", env=cli_env)
    assert result.returncode == 78
    assert "writable by every user" in one_error_line(result.stderr)
    assert db.read_bytes() == before
    doctor = tasklock("doctor", "--store", url, env=cli_env)
    assert "fail  permissions" in doctor.stdout and "chmod o-w" in doctor.stdout


@needs_root
def test_a_private_store_made_in_advance_by_another_user_is_refused(cli_env, shared_base):
    """nobody makes /tmp-like/locks.db first: root's private store would be theirs to forge;
    and a group-shared store (?mode=0660) of nobody's group is not root's group's."""
    db = shared_base / "locks.db"
    theirs = nobody_env(cli_env, shared_base / "nobody")
    for query in ("", "?mode=0660"):
        made = as_nobody(
            ["tasklock", "run", "--store", f"sqlite://{db}{query}", "k", "--", "true"], theirs
        )
        assert made.returncode == 0, made.stderr
    before = db.read_bytes()
    result = tasklock("run", "--store", f"sqlite://{db}", "k", "--", "true", env=cli_env)
    assert result.returncode == 78
    assert "belongs to nobody (uid 65534)" in one_error_line(result.stderr)
    assert db.read_bytes() == before
    shared = tasklock("run", "--store", f"sqlite://{db}?mode=0660", "k", "--", "true", env=cli_env)
    assert shared.returncode == 78
    assert "is of group nogroup (gid 65534), not root (gid 0)" in one_error_line(shared.stderr)
    assert db.read_bytes() == before


@needs_root
@pytest.mark.parametrize("via", ["HOME", "XDG_STATE_HOME"])
def test_as_root_a_default_store_in_another_users_directory_is_refused(cli_env, shared_base, via):
    """sudo -E: root with nobody's $HOME must not write into it."""
    home = shared_base / "home-of-nobody"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    env = {k: v for k, v in cli_env.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    if via == "XDG_STATE_HOME":
        env["XDG_STATE_HOME"] = str(home / "state")
    result = tasklock("run", "k", "--", "true", env=env)
    assert result.returncode == 78
    assert "belongs to nobody (uid 65534)" in one_error_line(result.stderr)
    assert os.listdir(home) == []


def test_a_relative_xdg_state_home_is_ignored(cli_env, tmp_path):
    env = {**cli_env, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": "relative/state"}
    result = tasklock("run", "k", "--", "sh", "-c", 'echo "$TASKLOCK_STORE"', env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sqlite://{tmp_path}/home/.local/state/tasklock/locks.db"
    assert not (tmp_path / "relative").exists()


def test_an_unknown_sqlite_url_parameter_or_mode_is_a_configuration_error(cli_env, tmp_path):
    for query in ("?mood=0660", "?mode=0666"):
        url = f"sqlite://{tmp_path}/locks.db{query}"
        result = tasklock("run", "--store", url, "k", "--", "true", env=cli_env)
        assert result.returncode == 78, query
        one_error_line(result.stderr)


# -- config lookup ------------------------------------------------------------------------


def _config(path: Path, store: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'store = "{store}"\nttl = "1s"\n')
    path.chmod(0o644)
    return path


@needs_root
def test_a_config_file_found_in_the_current_directory_written_by_someone_else_is_refused(
    cli_env, shared_base, tmp_path
):
    """git's CVE-2022-24765: another user's ./tasklock.toml must not choose root's store."""
    theirs = _config(shared_base / "tasklock.toml", f"sqlite://{shared_base}/theirs.db")
    os.chown(theirs, NOBODY, NOBODY)
    result = tasklock("run", "k", "--", "true", env=cli_env, cwd=shared_base)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert "tasklock.toml" in line and "belongs to user nobody (uid 65534)" in line
    assert not (shared_base / "theirs.db").exists()
    # named explicitly, it is used as given
    for how in (["--config", str(theirs)], []):
        env = cli_env if how else {**cli_env, "TASKLOCK_CONFIG": str(theirs)}
        used = tasklock(*how, "run", "k", "--", "true", env=env, cwd=shared_base)
        assert used.returncode == 0, used.stderr
    assert (shared_base / "theirs.db").exists()


def test_a_config_file_others_may_write_is_refused(cli_env, tmp_path):
    config = _config(Path(cli_env["XDG_CONFIG_HOME"]) / "tasklock" / "config.toml", "x")
    config.chmod(0o664)
    result = tasklock("run", "k", "--", "true", env=cli_env, cwd=tmp_path)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert str(config) in line and "group or others may write to it (mode 0664)" in line


@pytest.mark.parametrize("directory_mode", [0o775, 0o2770, 0o777])
def test_a_config_file_in_a_directory_others_may_rename_in_is_refused(
    cli_env, tmp_path, directory_mode
):
    """A ./tasklock.toml of ours (or root's) in a group- or world-writable directory that
    is not sticky: anyone who may write there can swap it between the check and the read
    (root used another user's config 14 times in 150), so it is not used."""
    shared = tmp_path / "shared"
    _config(shared / "tasklock.toml", f"sqlite://{tmp_path}/swapped.db")
    shared.chmod(directory_mode)
    result = tasklock("run", "k", "--", "true", env=cli_env, cwd=shared)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert "tasklock.toml is not used: its directory is writable by group or others" in line
    assert f"(mode {directory_mode:04o})" in line
    assert not (tmp_path / "swapped.db").exists()
    named = tasklock("--config", "tasklock.toml", "run", "k", "--", "true", env=cli_env, cwd=shared)
    assert named.returncode == 0, named.stderr  # named: used as given
    (tmp_path / "swapped.db").unlink()
    shared.chmod(directory_mode | stat.S_ISVTX)  # sticky: nobody else may rename in it
    used = tasklock("run", "k", "--", "true", env=cli_env, cwd=shared)
    assert used.returncode == 0, used.stderr
    assert (tmp_path / "swapped.db").exists()


def test_a_config_file_found_is_read_through_the_fd_that_was_checked(cli_env, tmp_path):
    """A FIFO named tasklock.toml (swapped in after the look for a file) neither blocks
    nor is read: refused, at once."""
    os.mkfifo(tmp_path / "tasklock.toml", 0o600)
    from tasklock_cli.config.file import read_trusted
    from tasklock_cli.errors import ConfigError

    started = time.monotonic()
    with pytest.raises(ConfigError, match="it is not a regular file"):
        read_trusted(str(tmp_path / "tasklock.toml"))
    assert time.monotonic() - started < 1


@needs_root
def test_as_root_a_config_directory_of_another_user_is_refused(cli_env, shared_base, tmp_path):
    config_home = shared_base / "config-of-nobody"
    config = _config(config_home / "tasklock" / "config.toml", f"sqlite://{tmp_path}/x.db")
    for path in (config_home, config.parent):
        os.chown(path, NOBODY, NOBODY)
    env = {**cli_env, "XDG_CONFIG_HOME": str(config_home)}
    result = tasklock("run", "k", "--", "true", env=env, cwd=tmp_path)
    assert result.returncode == 78
    assert "its directory belongs to user nobody" in one_error_line(result.stderr)


def test_a_relative_xdg_config_home_is_ignored(cli_env, tmp_path):
    _config(tmp_path / "relative" / "tasklock" / "config.toml", f"sqlite://{tmp_path}/rel.db")
    env = {**cli_env, "XDG_CONFIG_HOME": "relative", "HOME": str(tmp_path / "home")}
    result = tasklock("run", "k", "--", "true", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "rel.db").exists()


# -- what is kept -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "config"])
def test_no_record_args_keeps_only_the_first_word(cli_env, tmp_path, sqlite_url, how):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    args = ["--no-record-args"] if how == "flag" else []
    if how == "config":
        config = tmp_path / "tasklock.toml"
        config.write_text("record-args = false\n")
        config.chmod(0o600)
    script = "tasklock peek k --json; echo -pHUNTER2 >/dev/null"
    result = tasklock("run", "k", *args, "--", "sh", "-c", script, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["holder"]["command"] == ["sh"]
    history = tasklock("history", "k", "--json", env=env)
    assert json.loads(history.stdout)[0]["command"] == ["sh"]
    assert "HUNTER2" not in tasklock("history", "k", env=env).stdout


def test_the_child_gets_the_config_file_not_a_url_that_came_from_it(cli_env, tmp_path):
    url = f"sqlite://{tmp_path}/from-config.db"
    config = tmp_path / "tasklock.toml"
    config.write_text(f'store = "{url}"\n')
    config.chmod(0o600)
    show = 'echo "store=${TASKLOCK_STORE-unset} config=${TASKLOCK_CONFIG-unset}"; tasklock check'
    result = tasklock("run", "k", "--", "sh", "-c", show, env=cli_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"store=unset config={config}"
    from_env = tasklock("run", "k", "--", "sh", "-c", show, env={**cli_env, "TASKLOCK_STORE": url})
    assert from_env.stdout.splitlines()[0] == f"store={url} config=unset"


def test_the_holders_user_is_its_real_uids_name_not_logname(cli_env, sqlite_url):
    import pwd

    env = {**cli_env, "TASKLOCK_STORE": sqlite_url, "LOGNAME": "mallory", "USER": "mallory"}
    result = tasklock("run", "k", "--", "tasklock", "peek", "k", "--json", env=env)
    assert json.loads(result.stdout)["holder"]["user"] == pwd.getpwuid(os.getuid()).pw_name


def test_non_utf8_arguments_are_recorded_losslessly_and_run_on_every_store(cli_env, store_url):
    env = {**cli_env, "TASKLOCK_STORE": store_url}
    arg = b"caf\xe9\\x".decode("utf-8", "surrogateescape")
    result = subprocess.run(
        [executable(), "run", "k", "--", "printf", "%s", arg], env=env, capture_output=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"caf\xe9\\x"  # the command got its bytes
    history = subprocess.run(
        [executable(), "history", "k", "--json"], env=env, capture_output=True
    ).stdout
    recorded = json.loads(history.decode("utf-8"))[0]["command"]
    assert recorded == ["printf", "%s", "caf\\xe9\\\\x"]


def test_doctor_json_is_valid_utf8_for_a_store_path_that_is_not(cli_env, tmp_path):
    path = os.fsencode(tmp_path) + b"/caf\xe9.db"
    url = b"sqlite:///" + path
    result = subprocess.run(
        [executable(), "--store", os.fsdecode(url), "doctor", "--json"],
        env=cli_env,
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    checks = json.loads(result.stdout.decode("utf-8"))  # valid UTF-8, or this raises
    store = next(check["detail"] for check in checks if check["check"] == "store")
    assert store.endswith("caf\udce9.db")  # the byte, escaped losslessly by JSON


# -- what is printed ----------------------------------------------------------------------

HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202e[/][link=http://x]y"
ESCAPED = "\\x1b]0;owned\\x07\\x1b[2J\\u202e[/][link=http://x]y"


def _hold_as_someone_hostile(url: str, key: str):
    store = open_store(url)
    holder = Holder(
        host=f"h{HOSTILE}", pid=1, user=f"u{HOSTILE}", command=["c", HOSTILE], note=f"n{HOSTILE}"
    )
    store.acquire(key, 30.0, holder, os.urandom(16).hex())
    return store


def _let_go(store, key: str) -> None:
    store.force_release(key)
    store.close()


def test_fields_from_the_store_are_escaped_when_piped(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    key = "k[/]\u202e"
    store = _hold_as_someone_hostile(sqlite_url, key)
    try:
        listed = tasklock("list", env=env)
        assert listed.returncode == 0
        assert "\x1b" not in listed.stdout and "\u202e" not in listed.stdout
        assert f"n{ESCAPED}" in listed.stdout and "k[/]\\u202e" in listed.stdout
        peeked = tasklock("peek", key, env=env)
        assert "\x1b" not in peeked.stdout and f"u{ESCAPED}" in peeked.stdout
        conflict = tasklock("run", key, "--", "true", env=env)
        assert conflict.returncode == 75
        assert "\x1b" not in conflict.stderr and f"h{ESCAPED}" in conflict.stderr
        as_json = json.loads(tasklock("peek", key, "--json", env=env).stdout)
        assert as_json["holder"]["note"] == f"n{HOSTILE}"  # JSON keeps it exactly
    finally:
        _let_go(store, key)


def test_fields_from_the_store_never_reach_a_terminal_raw_nor_as_markup(cli_env, sqlite_url):
    from tests.test_terminal import _drive_pty
    from tests.test_terminal import run_in_pty

    env = {**cli_env, "TASKLOCK_STORE": sqlite_url, "COLUMNS": "400"}
    key = "k[/]"
    store = _hold_as_someone_hostile(sqlite_url, key)
    try:
        code, output = run_in_pty(["list"], env, [])
        assert code == 0, output
        assert b"\x1b]0;owned" not in output and b"\xe2\x80\xae" not in output
        assert b"\\x1b]0;owned" in output and b"[/]" in output

        interrupted: list[int] = []

        def stop_soon(pid: int, output: bytes, _master: int) -> None:
            if b"owned" in output and len(interrupted) < 2:  # Ctrl-C, and once more
                interrupted.append(pid)
                os.kill(pid, 2)

        code, output = _drive_pty(["list", "--watch", "--interval", "200ms"], env, stop_soon, 20)
        assert b"Traceback" not in output and b"\\x1b]0;owned" in output
        assert b"\x1b]0;owned" not in output
        code, output = run_in_pty(["run", key, "--wait", "700ms", "--", "true"], env, [])
        assert code == 75, output
        assert b"Traceback" not in output and b"\x1b]0;owned" not in output
        assert b"\\x1b]0;owned" in output
    finally:
        _let_go(store, key)
    free = tasklock("run", "--note", HOSTILE, key, "--", "true", env=env)
    assert free.returncode == 0, free.stderr
    code, output = run_in_pty(["history", key], env, [])
    assert code == 0 and b"Traceback" not in output
    assert b"\x1b]0;owned" not in output and b"\\x1b]0;owned" in output


@needs_root
def test_doctor_says_when_the_store_is_not_writable_by_me(cli_env, shared_base):
    db = shared_base / "locks.db"
    url = f"sqlite://{db}"
    assert tasklock("run", "--store", url, "k", "--", "true", env=cli_env).returncode == 0
    doctor = as_nobody(
        ["tasklock", "doctor", "--store", url], nobody_env(cli_env, shared_base / "n")
    )
    assert doctor.returncode != 0, doctor.stdout + doctor.stderr
    assert f"fail  permissions  {db} is not writable by you (nobody (uid 65534))" in doctor.stdout
    assert "belongs to root (uid 0)" in doctor.stdout
