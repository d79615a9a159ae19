"""What another writer of the store can put there, through the real executable on every
store: malformed rows are shown as malformed and counted, never a traceback, never in the
way of other keys; whatever came from the store is escaped in every output (terminal,
TSV, JSON, JSON event lines, Prometheus labels); the fencing counter ends cleanly; a
forged waiter holds nobody up."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import time
from datetime import datetime

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_FLOOR_S
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_MARGIN_S
from tasklock_cli.stores.model import Holder
from tests.support import forge
from tests.support import resp
from tests.support.cli import executable
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
    # Text: `?`, not the placeholder's 1970 (list's TSV, peek, a run's conflict).
    [line] = tasklock("list", env=env).stdout.splitlines()
    assert line.split("\t")[5:7] == ["?", "malformed"], line
    assert "expires   ?\n" in tasklock("peek", key, env=env).stdout
    refused = tasklock("run", key, "--", "true", env=env)
    assert refused.returncode == 75 and "until ?;" in refused.stderr, refused.stderr


def assert_bounded(env: dict, key: str, bound: float) -> str:
    """``key``'s lease now runs out within ``bound`` seconds, a good row; its expiry."""
    peeked = json.loads(tasklock("peek", key, "--json", env=env).stdout)
    assert peeked["held"] is True and "malformed" not in peeked, peeked
    assert bound - 5 < seconds_until(peeked["expires_at"]) <= bound + 1, peeked
    return peeked["expires_at"]


def test_release_force_bounds_a_forged_far_expiry(env, store_url):
    """A live lease that runs out in the year 9999 (someone else wrote it) claims more than
    any lease the store granted: release --force gives it the longest a holder's lease
    could have from now, so the key frees then, not in 9999 (a good row, shown so)."""
    hold(store_url, "far", ttl=HELD_S)
    if not forge.far_expiry(store_url, "far"):
        pytest.skip(f"{forge.kind_of(store_url)}: no forged far expiry bounded (see forge)")
    if forge.kind_of(store_url) != "sqlite":  # (SQLite's forgery is 31 years ahead)
        [listed] = json.loads(tasklock("list", "--json", env=env).stdout)
        assert listed["malformed"] is True and listed["expires_at"] is None, listed
        assert listed["problems"][0].startswith("expires_at: "), listed
    released = tasklock("release", "far", "--force", "--json", env=env)
    no_traceback(released)
    assert released.returncode == 75, released.stderr
    outcome = json.loads(released.stdout)
    assert outcome["freed"] is False and outcome["broken"] == [1], outcome
    assert seconds_until(outcome["free_at"]) <= BOUND_S + 1, outcome
    assert assert_bounded(env, "far", BOUND_S) == outcome["free_at"]


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


def test_a_waiter_place_with_a_forged_priority_is_shown_as_malformed(env, store_url):
    """A priority out of -100..100 (or not a number) in a place's record: shown null, the
    place malformed, nothing fatal."""
    hold(store_url, "k")
    forged = '{"host": "h", "pid": 5, "user": "u", "command": [], "priority": 1e9}'
    assert forge.forge_waiter(store_url, "k", expires_in=30, holder=forged)
    peeked = tasklock("peek", "k", "--json", env=env)
    no_traceback(peeked)
    [waiter] = json.loads(peeked.stdout)["waiters"]
    assert waiter["malformed"] is True and waiter["priority"] is None and waiter["pid"] == 5
    assert tasklock("peek", "k", env=env).returncode == 0


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


@pytest.mark.slow  # (waits out a 10 s lease)
@pytest.mark.parametrize("case", ["holder-null", "token-not-a-number"])
def test_release_force_breaks_a_malformed_lease_with_the_same_lock_delay(env, store_url, case):
    hold(store_url, "bad", ttl=10.0)  # (outlasts a slow start of release on a busy machine)
    if not forge.corrupt_lease(store_url, "bad", case):
        pytest.skip(f"{forge.kind_of(store_url)} cannot hold {case}")
    released = tasklock("release", "bad", "--force", "--json", env=env)
    no_traceback(released)
    # Nobody answers for it (a row that cannot be read may still be a live holder's):
    # the key frees when the lease runs out, as for a good row.
    assert released.returncode == 75, released.stderr
    outcome = json.loads(released.stdout)
    assert outcome["freed"] is False and outcome["free_at"] is not None
    ran = tasklock("run", "bad", "--wait", "20s", "--", "echo", "ran", env=env)
    if case == "token-not-a-number" and forge.kind_of(store_url) == "sqlite":
        # The key's counter is its rows' highest token: one that is no integer leaves it
        # unknown, and no token is issued from it (test_forged_counters.py).
        assert ran.returncode == 78 and "fencing counter of 'bad'" in ran.stderr, ran.stderr
        return
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr


# -- hostile servers --------------------------------------------------------------------


def test_a_verbose_traceback_shows_a_servers_error_text_escaped(cli_env):
    """-v prints the traceback, which holds the server's error reply: escaped like every
    other line tasklock prints (text mode), and as valid JSON with --log-format json."""
    hostile = "ERR \x1b]0;pwned\x07\x1b[2J\u202e"
    answer = lambda words: resp.OK if words[0] == b"CLIENT" else resp.error(hostile)  # noqa: E731
    with resp.resp_server(answer) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        shown = tasklock("-v", "--store", url, "peek", "k", env=cli_env)
        as_json = tasklock("-v", "--log-format", "json", "--store", url, "peek", "k", env=cli_env)
    assert shown.returncode == 69, shown.stderr
    assert "Traceback" in shown.stderr and "\\x1b]0;pwned\\x07" in shown.stderr
    assert not RAW.search(shown.stderr), shown.stderr
    assert shown.stderr.splitlines()[-1].startswith("tasklock: error: ")
    assert as_json.returncode == 69 and not RAW.search(as_json.stderr), as_json.stderr
    assert hostile.removeprefix("ERR ") in json.loads(as_json.stderr)["traceback"]


#: What a sentinel can answer that no sentinel would: (ip, port, more fields).
LYING_SENTINELS = [
    ("127.0.0.1", "notaport"),
    ("127.0.0.1", "99999999999999999999"),
    ("127.0.0.1", "²"),
    ("a" * 64 + ".example", "6379"),
    ("127.0.0.1", "6379", "num-other-sentinels", "many"),
    ("127.0.0.1", "6379", "flags", None),  # (no flags at all)
]


@pytest.mark.server  # (private redis-servers)
def test_a_lying_sentinel_listed_first_is_outvoted_not_a_traceback(cli_env):
    """A sentinel's reply is validated before it counts: the honest majority (two real
    sentinels) names the primary, whatever the first one listed says; alone, the liar
    names none (69, one line)."""
    from tests.support.redis_failover import SERVICE
    from tests.support.redis_failover import Sentinels
    from tests.support.redis_support import PrivateRedis
    from tests.support.redis_support import require_redis_server

    require_redis_server()
    server = PrivateRedis().start()
    honest = Sentinels(server.port, count=2)
    try:
        honest.wait_ready(replicas=0)
        for lie in LYING_SENTINELS:
            with resp.resp_server(resp.sentinel_master(*lie)) as liar:
                hosts = ",".join(f"127.0.0.1:{port}" for port in [liar.port, *honest.ports])
                url = f"redis+sentinel://{hosts}/{SERVICE}/0"
                # (peek, not run: a server started this instant is in its quarantine)
                peeked = tasklock("--store", url, "peek", "k", "--json", env=cli_env)
                assert peeked.returncode == 1, (lie, peeked.stderr)
                assert json.loads(peeked.stdout)["held"] is False
                alone = f"redis+sentinel://127.0.0.1:{liar.port},127.0.0.1:1/{SERVICE}"
                refused = tasklock("--store", alone, "peek", "k", env=cli_env)
                assert refused.returncode == 69, (lie, refused.stderr)
                assert "no primary for service" in one_error_line(refused.stderr)
    finally:
        honest.stop()
        server.stop()


# -- keys that are not UTF-8, another application's keys ------------------------------


@pytest.fixture(params=["sqlite", "redis", "mysql"])
def byte_keys_url(request, tmp_path):
    """A fresh namespace of a store whose keys can hold bytes that are not UTF-8."""
    from tests.conftest import store_url_for
    from tests.support import services

    services.require(request.param)
    url = store_url_for(request.param, tmp_path)
    yield url
    services.cleanup(request.param, url)


def test_keys_that_are_not_utf8_are_shown_counted_apart_and_releasable(cli_env, byte_keys_url):
    """Lease, ledger and waiter keys that are not UTF-8 (written by someone else): list
    and metrics show them as malformed, one series per byte string (none merged into
    another, nor into the key "n\ufffd"), and release --force breaks such a lease."""
    url = byte_keys_url
    env = {**cli_env, "TASKLOCK_STORE": url, "TASKLOCK_TEST_LET_GO_TIMEOUT": "1"}
    for key in ("r1", "r2", "n\ufffd"):
        assert tasklock("run", key, "--", "true", env=env).returncode == 0
    hold(url, "good")
    hold(url, "bad")
    assert forge.forge_waiter(url, "w", expires_in=30)
    forge.rename_key(url, "r1", b"n\xff", "runs")
    forge.rename_key(url, "r2", b"n\xfe", "runs")
    forge.rename_key(url, "bad", b"b\xff", "lease")
    forge.rename_key(url, "w", b"w\xff", "waiters")

    listed = tasklock("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    good, bad = sorted(json.loads(listed.stdout), key=lambda entry: entry["key"] is None)
    assert good["key"] == "good" and "malformed" not in good
    assert bad["key"] is None and bad["problems"] == ["key: is not UTF-8"]  # (unreadable: null)
    assert "b\\udcff\t" in tasklock("list", env=env).stdout  # (text: escaped)
    metrics = tasklock("metrics", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert not RAW.search(metrics.stdout)
    for label, malformed in [
        ('key="n\\\\udcff",escaped="true"', 1),
        ('key="n\\\\udcfe",escaped="true"', 1),
        ('key="n\ufffd"', 0),
        ('key="b\\\\udcff",escaped="true"', 1),
        ('key="w\\\\udcff",escaped="true"', 1),
        ('key="good"', 0),
    ]:
        assert f"tasklock_malformed_records{{{label}}} {malformed}\n" in metrics.stdout, label

    released = subprocess.run(
        [executable().encode(), b"release", b"b\xff", b"--force", b"--json"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert released.returncode == 75, released.stderr  # broken; nobody let go (lock-delay)
    assert json.loads(released.stdout)["broken"] == [1]
    assert tasklock("run", "other", "--", "true", env=env).returncode == 0


def test_another_applications_key_under_the_prefix_stops_no_listing(cli_env, redis_url):
    """A Redis key of another type where a lease would be is one malformed record: list
    and metrics go on; a lease whose slot field is forged is broken, not a traceback."""
    env = {**cli_env, "TASKLOCK_STORE": redis_url, "TASKLOCK_TEST_LET_GO_TIMEOUT": "1"}
    hold(redis_url, "good")
    hold(redis_url, "slotx")
    client, names = forge._redis(redis_url)
    try:
        client.set(names.lease("wrong"), "another application's string")
        client.hset(names.lease("slotx"), "slot", "x")
    finally:
        client.close()
    listed = tasklock("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    entries = {entry["key"]: entry for entry in json.loads(listed.stdout)}
    assert set(entries) == {"good", "slotx", "wrong"}
    assert entries["wrong"]["malformed"] is True
    assert entries["wrong"]["problems"][0] == "lease: is a Redis string, not a lease hash"
    metrics = tasklock("metrics", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert 'tasklock_malformed_records{key="wrong"} 1\n' in metrics.stdout
    assert 'tasklock_held{key="good"} 1\n' in metrics.stdout
    released = tasklock("release", "slotx", "--force", "--json", env=env)
    no_traceback(released)
    assert released.returncode == 75, released.stderr
    assert json.loads(released.stdout)["broken"] == [1]
    assert tasklock("run", "slotx", "--", "true", env=env).returncode == 75  # (lock-delay)


@pytest.mark.server  # (a private TLS redis-server)
def test_rediss_sentinel_verifies_the_primarys_certificate_and_host_name(cli_env, tmp_path):
    """The sentinels choose where the password goes; over TLS the primary they name must
    show a certificate of the URL's CA for the address they named, or nothing is sent to
    it (69, one line). Sentinel and primaries are private: a TLS redis-server each, and a
    scripted TLS sentinel naming it."""
    from tests.support import tls
    from tests.support.ports import free_port
    from tests.support.redis_support import PrivateRedis
    from tests.support.redis_support import require_redis_server

    require_redis_server()
    tls.require_openssl()
    ca = tls.make_ca(tmp_path)
    certificates = {
        "right name": tls.make_server_cert(tmp_path, "right", "IP:127.0.0.1"),
        "other name": tls.make_server_cert(tmp_path, "other", "DNS:elsewhere.example"),
    }
    sentinel_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sentinel_tls.load_cert_chain(*certificates["right name"])
    outcomes = {}
    for name, (cert, key) in certificates.items():
        port = free_port()
        files = ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        files += ["--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
        primary = PrivateRedis(password="data-pw", extra_args=["--tls-port", str(port), *files])
        primary.start()
        try:
            naming = resp.sentinel_master("127.0.0.1", str(port))
            with resp.resp_server(naming, sentinel_tls) as sentinel:
                url = (
                    f"rediss+sentinel://:data-pw@127.0.0.1:{sentinel.port}/svc/0?ssl_ca_certs={ca}"
                )
                outcomes[name] = tasklock("--store", url, "peek", "k", "--json", env=cli_env)
        finally:
            primary.stop()
    right = outcomes["right name"]
    assert right.returncode == 1 and json.loads(right.stdout)["held"] is False, right.stderr
    other = outcomes["other name"]
    assert other.returncode == 69, other.stderr
    line = one_error_line(other.stderr)
    assert "certificate verify failed" in line and "data-pw" not in line
