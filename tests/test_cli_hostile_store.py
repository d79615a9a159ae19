"""What another writer of the store can put there, through the real executable on every
store: malformed rows are shown as malformed and counted, never a traceback, never in the
way of other keys; whatever came from the store is escaped in every output (terminal,
TSV, JSON, JSON event lines, Prometheus labels); the fencing counter ends cleanly; a
forged waiter holds nobody up."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_FLOOR_S
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_MARGIN_S
from tasklock_cli.stores.model import Holder
from tests.support import forge
from tests.support.cli import one_error_line
from tests.support.cli import tasklock

#: What must never reach an output raw: C0 but tab and newline, DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x7f\x85\u009b\u202e[/][link=http://x]y"


@pytest.fixture
def env(cli_env, store_url):
    return {**cli_env, "TASKLOCK_STORE": store_url, "TASKLOCK_TEST_LET_GO_TIMEOUT": "1"}


def hold(url: str, key: str, note: str | None = None, ttl: float = 30.0) -> None:
    """A live lease on ``key`` whose holder never renews (it runs out after ``ttl``)."""
    with open_store(url) as store:
        holder = Holder("host", 4242, "user", ["cmd"], note)
        assert store.acquire(key, ttl, holder, os.urandom(16).hex()) is not None


def no_traceback(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr


# -- malformed lease rows -------------------------------------------------------------


@pytest.mark.parametrize("case", list(forge.CORRUPTIONS))
def test_a_malformed_lease_is_shown_counted_and_stops_nothing_else(env, store_url, case):
    hold(store_url, "good")
    hold(store_url, "bad")
    if not forge.corrupt_lease(store_url, "bad", case):
        pytest.skip(f"{forge.kind_of(store_url)} cannot hold {case}")

    listed = tasklock("list", "--json", env=env)
    no_traceback(listed)
    assert listed.returncode == 0, listed.stderr
    entries = {entry["key"]: entry for entry in json.loads(listed.stdout)}
    assert set(entries) == {"good", "bad"}
    assert "malformed" not in entries["good"] and entries["good"]["holder"]["pid"] == 4242
    assert entries["bad"]["malformed"] is True and entries["bad"]["problems"]

    table = tasklock("list", env=env)
    assert table.returncode == 0 and "\tmalformed\t" in table.stdout, table.stderr
    assert re.search(r"^good\thost\t4242\t", table.stdout, re.M)

    peeked = tasklock("peek", "bad", env=env)
    assert peeked.returncode == 0 and "malformed" in peeked.stdout, peeked.stderr
    as_json = json.loads(tasklock("peek", "bad", "--json", env=env).stdout)
    assert as_json["held"] is True and as_json["malformed"] is True

    metrics = tasklock("metrics", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert 'tasklock_malformed_records{key="bad"} 1\n' in metrics.stdout
    assert 'tasklock_malformed_records{key="good"} 0\n' in metrics.stdout

    # The slot of a row that cannot be read stays taken (it may be a live holder's).
    conflict = tasklock("run", "bad", "--", "true", env=env)
    assert conflict.returncode == 75, conflict.stderr
    no_traceback(conflict)
    assert len(conflict.stderr.splitlines()) == 1 and "malformed record" in conflict.stderr
    assert tasklock("run", "other", "--", "true", env=env).returncode == 0


@pytest.mark.parametrize(
    "data",
    ["{not json", "null", '{"holder": null, "outcome": 7, "exit_code": "x", "slot": -1}'],
)
def test_malformed_ledger_records_are_shown_and_counted(env, store_url, data):
    assert tasklock("run", "job", "--", "true", env=env).returncode == 0
    assert tasklock("run", "job", "--", "false", env=env).returncode == 1
    forge.corrupt_runs(store_url, "job", data)

    history = tasklock("history", "job", "--json", env=env)
    no_traceback(history)
    assert history.returncode == 0, history.stderr
    runs = json.loads(history.stdout)
    assert len(runs) == 2 and all(run["malformed"] is True for run in runs)
    piped = tasklock("history", "job", env=env)
    assert piped.returncode == 0 and piped.stdout.count("\tmalformed\t") == 2, piped.stderr
    metrics = tasklock("metrics", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert 'tasklock_malformed_records{key="job"} 2\n' in metrics.stdout
    assert tasklock("run", "job", "--once-per", "1h", "--", "true", env=env).returncode == 0


# -- leases whose expiry cannot be read ----------------------------------------------

HELD_S = 10.0
#: The expiry an unreadable one gets, from now, when no TTL above the floor was granted.
BOUND_S = UNREADABLE_EXPIRY_FLOOR_S + UNREADABLE_EXPIRY_MARGIN_S


def seconds_until(shown: str) -> float:
    return datetime.fromisoformat(shown.replace("Z", "+00:00")).timestamp() - time.time()


def no_expiry(env: dict, store_url: str, key: str, case: str) -> None:
    """``key`` held (TTL 10 s), then its expiry made unreadable: shown as malformed."""
    hold(store_url, key, ttl=HELD_S)
    if not forge.corrupt_expiry(store_url, key, case):
        pytest.skip("etcd: a lease's expiry is its etcd lease's TTL")
    [shown] = json.loads(tasklock("list", "--json", env=env).stdout)
    assert shown["key"] == key and shown["malformed"] is True, shown
    assert shown["expires_at"] is None and shown["expired"] is False


def assert_bounded(env: dict, key: str, bound: float) -> str:
    """``key``'s lease now runs out within ``bound`` seconds, a good row; its expiry."""
    peeked = json.loads(tasklock("peek", key, "--json", env=env).stdout)
    assert peeked["held"] is True and "malformed" not in peeked, peeked
    assert bound - 5 < seconds_until(peeked["expires_at"]) <= bound + 1, peeked
    return peeked["expires_at"]


@pytest.mark.parametrize("case", forge.EXPIRY_CORRUPTIONS)
def test_release_force_gives_an_unreadable_expiry_the_longest_a_holder_could_have(
    env, store_url, case
):
    no_expiry(env, store_url, "bad", case)
    released = tasklock("release", "bad", "--force", "--json", env=env)
    no_traceback(released)
    # Nobody let go: the lease stays, broken, until the longest TTL granted (10 s, under
    # the floor) could have run out from now; free_at says when. (Redis's PX, when it is
    # still there, is the lease's expiry: its expires_at is told it.)
    assert released.returncode == 75, released.stderr
    outcome = json.loads(released.stdout)
    assert outcome["freed"] is False and outcome["broken"] == [1]
    bound = HELD_S if forge.keeps_ttl(store_url, case) else BOUND_S
    assert assert_bounded(env, "bad", bound) == outcome["free_at"]
    assert tasklock("run", "bad", "--", "true", env=env).returncode == 75


@pytest.mark.parametrize("case", forge.EXPIRY_CORRUPTIONS)
def test_sweep_gives_an_unreadable_expiry_the_longest_ttl_granted(env, store_url, case):
    hold(store_url, "long", ttl=45.0)  # the longest TTL granted: above the floor
    hold(store_url, "bad", ttl=HELD_S)
    if not forge.corrupt_expiry(store_url, "bad", case):
        pytest.skip("etcd: a lease's expiry is its etcd lease's TTL")
    swept = tasklock("sweep", env=env)
    assert swept.returncode == 0, swept.stderr
    kept = forge.keeps_ttl(store_url, case)
    assert_bounded(env, "bad", HELD_S if kept else 45.0 + UNREADABLE_EXPIRY_MARGIN_S)
    assert tasklock("run", "bad", "--", "true", env=env).returncode == 75


@pytest.mark.slow
@pytest.mark.waits
def test_a_lease_whose_expiry_cannot_be_read_frees_once_its_bound_has_passed(env, store_url):
    no_expiry(env, store_url, "bad", "expiry-none")
    assert tasklock("sweep", env=env).returncode == 0
    ran = tasklock("run", "bad", "--wait", f"{BOUND_S + 10}s", "--", "echo", "ran", env=env)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr


# -- SQLite text that is not UTF-8 ----------------------------------------------------


def test_sqlite_text_that_is_not_utf8_is_malformed_and_stops_nothing_else(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    for key in ("good", "ran"):
        assert tasklock("run", key, "--", "true", env=env).returncode == 0
    for key in ("good", "k", "h"):
        hold(sqlite_url, key)
    bad = "CAST(? AS TEXT)"  # (bytes bind as a blob; as text they are not UTF-8)
    forge._sqlite(
        sqlite_url, f"UPDATE tasklock_leases SET key = {bad} WHERE key = 'k'", (b"k\xff",)
    )
    forge._sqlite(
        sqlite_url, f"UPDATE tasklock_leases SET holder = {bad} WHERE key = 'h'", (b"{\xff",)
    )
    forge._sqlite(
        sqlite_url, f"UPDATE tasklock_runs SET data = {bad} WHERE key = 'ran'", (b"\xfe",)
    )
    assert forge.forge_waiter(sqlite_url, "good", expires_in=30)
    forge._sqlite(sqlite_url, f"UPDATE tasklock_waiters SET holder = {bad}", (b"\xff",))

    listed = tasklock("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert [entry.get("malformed", False) for entry in entries] == [False, True, True]
    assert entries[0]["key"] == "good" and entries[0]["waiting"] == 1
    assert {problem for entry in entries[1:] for problem in entry["problems"]} == {
        "key: is not UTF-8",
        "holder: is not UTF-8",
    }
    peeked = tasklock("peek", "good", "--json", env=env)
    assert peeked.returncode == 0, peeked.stderr
    [waiter] = json.loads(peeked.stdout)["waiters"]
    assert waiter["malformed"] is True
    history = tasklock("history", "ran", "--json", env=env)
    assert history.returncode == 0, history.stderr
    [run] = json.loads(history.stdout)
    assert run["malformed"] is True and run["problems"][0] == "data: is not UTF-8"
    metrics = tasklock("metrics", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert 'tasklock_malformed_records{key="ran"} 1\n' in metrics.stdout
    assert 'tasklock_held{key="good"} 1\n' in metrics.stdout
    assert tasklock("run", "other", "--", "true", env=env).returncode == 0


# -- fencing tokens at their end ------------------------------------------------------


def test_the_fencing_counter_ends_with_a_clean_error_not_a_float(env, store_url):
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    if not forge.set_counter(store_url, "k", 2**63 - 2):
        pytest.skip("etcd's tokens are its revisions: nobody can set them")
    last = tasklock("run", "k", "--", "sh", "-c", "echo $TASKLOCK_FENCING_TOKEN", env=env)
    assert last.returncode == 0, last.stderr
    assert last.stdout == f"{2**63 - 1}\n"
    after = tasklock("run", "k", "--", "echo", "ran", env=env)
    assert after.returncode == 78 and after.stdout == ""
    assert "2**63-1" in one_error_line(after.stderr)
    as_json = tasklock("run", "k", "--log-format", "json", "--", "true", env=env)
    assert as_json.returncode == 78 and json.loads(as_json.stderr)["code"] == 78


# -- forged waiters -------------------------------------------------------------------


def test_a_forged_waiter_that_no_renewal_could_have_made_holds_nobody_up(env, store_url):
    assert tasklock("init", env=env).returncode == 0
    assert forge.forge_waiter(store_url, "k", expires_in=10**6)
    peeked = json.loads(tasklock("peek", "k", "--json", env=env).stdout)
    assert peeked["waiters"] == []
    ran = tasklock("run", "k", "--", "echo", "ran", env=env)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr


@pytest.mark.server  # etcd
def test_an_etcd_waiter_place_on_no_lease_holds_nobody_up_and_sweep_removes_it(cli_env, tmp_path):
    from tests.conftest import store_url_for
    from tests.support import services

    services.require("etcd")
    url = store_url_for("etcd", tmp_path)
    env = {**cli_env, "TASKLOCK_STORE": url}
    for key in ("k", "s"):
        assert forge.forge_waiter(url, key, expires_in=30, on_lease=False)
    assert json.loads(tasklock("peek", "k", "--json", env=env).stdout)["waiters"] == []
    ran = tasklock("run", "k", "--", "echo", "ran", env=env)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr
    assert tasklock("sweep", env=env).returncode == 0
    with open_store(url) as store:  # the other key's place is gone too
        assert forge.etcd_queue_names(url) == []
        assert store.waiters("s") == []


def test_a_waiter_place_with_a_malformed_holder_is_shown_as_malformed(env, store_url):
    hold(store_url, "k")
    assert forge.forge_waiter(store_url, "k", expires_in=30, holder="{not json")
    peeked = tasklock("peek", "k", "--json", env=env)
    no_traceback(peeked)
    [waiter] = json.loads(peeked.stdout)["waiters"]
    assert waiter["malformed"] is True and waiter["pid"] is None
    text = tasklock("peek", "k", env=env)
    assert text.returncode == 0 and "malformed" in text.stdout, text.stderr


# -- everything printed is escaped ----------------------------------------------------


def test_json_outputs_escape_c1_and_bidi_and_stay_valid(env, store_url):
    hold(store_url, "k\u202e", note=f"n{HOSTILE}")
    for args in (["peek", "k\u202e", "--json"], ["list", "--json"]):
        result = tasklock(*args, env=env)
        assert not RAW.search(result.stdout), (args, result.stdout)
        shown = json.loads(result.stdout)
        entry = shown if isinstance(shown, dict) else shown[0]
        assert entry["holder"]["note"] == f"n{HOSTILE}"  # JSON keeps it exactly
    waited = tasklock("run", "k\u202e", "--log-format", "json", "--", "true", env=env)
    assert waited.returncode == 75
    assert not RAW.search(waited.stderr), waited.stderr
    for line in waited.stderr.splitlines():
        json.loads(line)  # DEL and C1 do not make the event lines invalid JSON


def test_metrics_labels_escape_control_and_bidi_characters(env, store_url):
    assert tasklock("run", "rtl\u202e", "--", "true", env=env).returncode == 0
    assert tasklock("run", "plain\\x1b", "--", "true", env=env).returncode == 0
    result = tasklock("metrics", env=env)
    assert result.returncode == 0 and not RAW.search(result.stdout), result.stdout
    assert 'tasklock_held{key="rtl\\\\u202e",escaped="true"} 0\n' in result.stdout
    # a key that needs no escaping is its own label, and never one an escaped key has
    assert 'tasklock_held{key="plain\\\\x1b"} 0\n' in result.stdout


def test_forged_keys_with_control_characters_are_escaped_in_metrics(env, sqlite_url, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    forged = "k\x1b[2J\r\x00\u009b"
    forge._sqlite(sqlite_url, "UPDATE tasklock_runs SET key = ?", (forged,))
    result = tasklock("metrics", env=env)
    assert result.returncode == 0 and not RAW.search(result.stdout), result.stdout
    assert 'key="k\\\\x1b[2J\\\\r\\\\x00\\\\x9b",escaped="true"' in result.stdout


def test_history_on_a_terminal_never_shows_outcome_raw_nor_reads_it_as_markup(cli_env, sqlite_url):
    from tests.test_terminal import run_in_pty

    env = {**cli_env, "TASKLOCK_STORE": sqlite_url, "COLUMNS": "400"}
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    data = {"holder": {"host": "h", "pid": 1, "user": "u", "command": []}, "exit_code": 0}
    data |= {"outcome": f"{HOSTILE}[/]", "detected_by": "\x1b[5m[/]\x1b]8;;http://x\x07"}
    forge.corrupt_runs(sqlite_url, "k", json.dumps(data))
    code, output = run_in_pty(["history", "k"], env, [])
    assert code == 0 and b"Traceback" not in output, output
    assert b"\x1b]0;owned" not in output and b"\x1b[5m" not in output and b"\x1b]8;" not in output
    assert b"\xe2\x80\xae" not in output and b"\\x1b]0;owned" in output


@pytest.mark.parametrize("case", ["holder-null", "token-not-a-number"])
def test_release_force_breaks_a_malformed_lease_with_the_same_lock_delay(env, store_url, case):
    hold(store_url, "bad", ttl=3.0)
    if not forge.corrupt_lease(store_url, "bad", case):
        pytest.skip(f"{forge.kind_of(store_url)} cannot hold {case}")
    released = tasklock("release", "bad", "--force", "--json", env=env)
    no_traceback(released)
    # Nobody answers for it (a row that cannot be read may still be a live holder's):
    # the key frees when the lease runs out, as for a good row.
    assert released.returncode == 75, released.stderr
    outcome = json.loads(released.stdout)
    assert outcome["freed"] is False and outcome["free_at"] is not None
    ran = tasklock("run", "bad", "--wait", "10s", "--", "echo", "ran", env=env)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr
