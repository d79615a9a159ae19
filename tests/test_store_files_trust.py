"""Whose files an SQLite store trusts on a host with several users (issue 36): the
directories beside a store, a group-shared store's file, and directories made without
following a name that was swapped for a symlink between ``mkdir`` and ``chmod``.

Run as root with nobody (uid 65534, primary group nogroup) as the other user, as in
test_multi_user; the tests that need one are skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import executable
from tests.support.cli import one_error_line
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.test_multi_user import NOBODY
from tests.test_multi_user import NOGROUP
from tests.test_multi_user import as_nobody
from tests.test_multi_user import group_directory
from tests.test_multi_user import mode
from tests.test_multi_user import needs_root
from tests.test_multi_user import nobody_env
from tests.test_multi_user import nobody_tasklock

USERS = 100  # a group nobody is not a member of in the group database


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory every user can reach and write to, sticky like /tmp."""
    base = Path(tempfile.mkdtemp(prefix="tasklock-trust-", dir="/var/tmp"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def nobody_python() -> str:
    return nobody_tasklock()[0]


# -- the directories beside a store ----------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    ("side", "how"),
    [
        (".holders", "0777"),
        (".waiters", "0700"),
        (".holders", "symlink"),
    ],
)
def test_a_directory_beside_the_store_made_by_another_user_is_refused(
    cli_env, shared_base, side, how
):
    """nobody makes locks.db.holders (or .waiters) before root's private store is made in
    a /tmp-like directory: refused (78, naming it), and nothing is written there."""
    db = shared_base / "locks.db"
    target = shared_base / f"locks.db{side}"
    make = {
        "0777": f"import os; os.mkdir({str(target)!r}); os.chmod({str(target)!r}, 0o777)",
        "0700": f"import os; os.mkdir({str(target)!r}, 0o700)",
        "symlink": (
            f"import os; os.mkdir({str(shared_base / 'mine')!r}, 0o777); "
            f"os.symlink({str(shared_base / 'mine')!r}, {str(target)!r})"
        ),
    }[how]
    made = as_nobody([nobody_python(), "-c", make], cli_env)
    assert made.returncode == 0, made.stderr
    for command in (["run", "k", "--", "true"], ["release", "k", "--force"]):
        result = tasklock("--store", f"sqlite://{db}", *command, env=cli_env)
        assert result.returncode == 78, (command, result.stderr)
        line = one_error_line(result.stderr)
        assert str(target) in line and "refusing the store beside it" in line
        assert "nobody (uid 65534)" in line or "writable by every user" in line
    listed = target if how != "symlink" else shared_base / "mine"
    assert os.listdir(listed) == []


@needs_root
def test_a_directory_beside_a_shared_store_made_by_a_member_of_its_group_is_used(
    cli_env, shared_base
):
    """A member of the group made locks.db.waiters (the group's, 2770): root uses it."""
    team = group_directory(shared_base, NOGROUP)
    waiters = team / "locks.db.waiters"
    made = as_nobody(
        [nobody_python(), "-c", f"import os; os.mkdir({str(waiters)!r}, 0o770)"], cli_env
    )
    assert made.returncode == 0, made.stderr
    url = f"sqlite://{team}/locks.db?mode=0660"
    env = {**cli_env, "TASKLOCK_STORE": url}
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(url, "k")
        waiter = start("run", "k", "--wait", "30s", "--", "true", env=env)
        assert tasklock("release", "k", "--force", env=env).returncode == 0
        assert waiter.wait(timeout=30) == 0
    finally:
        holder.kill()
        holder.wait()
    assert os.stat(waiters).st_uid == NOBODY


# -- a group-shared store's file ----------------------------------------------------------


@needs_root
def test_a_shared_store_of_an_owner_outside_its_group_is_refused(cli_env, shared_base):
    """nobody (a member of "users" only in this session, not in the group database) makes
    the shared store in a setgid directory of "users": root refuses it."""
    team = group_directory(shared_base, USERS)
    db = team / "locks.db"
    url = f"sqlite://{db}?mode=0660"
    made = as_nobody(
        ["tasklock", "run", "--store", url, "k", "--", "true"],
        nobody_env(cli_env, shared_base / "nobody"),
        groups=(USERS,),
    )
    assert made.returncode == 0, made.stderr
    assert (os.stat(db).st_uid, os.stat(db).st_gid) == (NOBODY, USERS)
    before = db.read_bytes()
    result = tasklock("run", "--store", url, "k", "--", "true", env=cli_env)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert "belongs to nobody (uid 65534), who is not a member of its group users" in line
    assert db.read_bytes() == before


@needs_root
def test_a_shared_store_of_a_member_of_its_group_is_used(cli_env, shared_base):
    """The README's sharing: a setgid directory of the group; one member makes the store,
    another user (root) uses it."""
    team = group_directory(shared_base, NOGROUP)
    url = f"sqlite://{team}/locks.db?mode=0660"
    made = as_nobody(
        ["tasklock", "run", "--store", url, "k", "--", "true"],
        nobody_env(cli_env, shared_base / "nobody"),
    )
    assert made.returncode == 0, made.stderr
    assert os.stat(team / "locks.db").st_uid == NOBODY
    result = tasklock("run", "--store", url, "k", "--", "true", env=cli_env)
    assert result.returncode == 0, result.stderr


# -- directories made without following a swapped name ----------------------------------

#: Run as the other user: wait for DIRECTORY to appear, then swap it for a symlink to
#: VICTIM (what a member of a shared store's group can do in its non-sticky directory).
_SWAP = """
import os, sys, time
directory, victim = sys.argv[1:]
give_up = time.monotonic() + 20
while time.monotonic() < give_up:
    try:
        os.rmdir(directory)
    except OSError:
        time.sleep(0.0005)
        continue
    os.symlink(victim, directory)
    print("swapped")
    break
"""


def _under_strace_delaying_mkdir(directory: Path, args: list[str], env: dict) -> list[str]:
    """``args`` (tasklock's) under strace, each ``mkdir`` of ``directory`` returning 0.5 s
    late: a deterministic window between tasklock's ``mkdir`` and what follows it."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (.ci/run installs it)")
    return [
        strace,
        "-f",
        "-o",
        "/dev/null",
        "-P",
        str(directory),
        "-e",
        "trace=mkdir,mkdirat",
        "-e",
        "inject=mkdir,mkdirat:delay_exit=500000",
        executable(),
        *args,
    ]


def _swap_while_made(directory: Path, victim: Path, args: list[str], env: dict):
    """Run tasklock ``args`` as root while nobody swaps ``directory`` for a symlink to
    ``victim`` right after tasklock's ``mkdir``; tasklock's result."""
    swapper = subprocess.Popen(
        [nobody_python(), "-c", _SWAP, str(directory), str(victim)],
        user=NOBODY,
        group=NOGROUP,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        command = _under_strace_delaying_mkdir(directory, args, env)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert swapper.wait(timeout=30) == 0
        assert piped(swapper.stdout).read().strip() == "swapped"  # the race was run
    finally:
        if swapper.poll() is None:
            swapper.kill()
            swapper.wait()
    return result


@needs_root
def test_a_wake_up_directory_swapped_for_a_symlink_is_never_chmodded_through(
    cli_env, shared_base, tmp_path
):
    """A member of a shared store's group swaps the locks.db.waiters/ root just made for a
    symlink to a root file: root's mode change never reaches that file."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    team = group_directory(shared_base, NOGROUP)
    url = f"sqlite://{team}/locks.db?mode=0660"
    env = {**cli_env, "TASKLOCK_STORE": url}
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(url, "k")
        waiters = team / "locks.db.waiters"
        result = _swap_while_made(waiters, victim, ["run", "k", "--wait", "1s", "--", "true"], env)
        assert result.returncode == 75, result.stderr
    finally:
        holder.kill()
        holder.wait()
    assert mode(victim) == 0o600
    assert stat.S_ISLNK(os.lstat(waiters).st_mode)  # theirs, left alone


@needs_root
def test_the_default_store_directory_swapped_for_a_symlink_is_never_chmodded_through(
    cli_env, shared_base, tmp_path
):
    """$XDG_STATE_HOME is root's but group-writable (a group member may rename in it):
    the tasklock/ root makes there, swapped for a symlink, is refused (78) and the file
    it points to keeps its mode."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o644)
    state = group_directory(shared_base, NOGROUP, "state")
    env = {**cli_env, "XDG_STATE_HOME": str(state)}
    result = _swap_while_made(state / "tasklock", victim, ["run", "k", "--", "true"], env)
    assert result.returncode == 78, result.stderr
    assert "replaced as it was made" in one_error_line(result.stderr)
    assert mode(victim) == 0o644
