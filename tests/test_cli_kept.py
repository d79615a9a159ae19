"""A lease kept by ``run --hold-at-least`` after its command ended is not a live run:
``peek``, ``list`` (text and ``--json``) and a conflicting run say so, and until when, on
every store (each marks it its own way: ``Store.release`` with ``keep_for``)."""

from __future__ import annotations

import json
import re

from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder


def test_a_kept_lease_says_its_command_ended_and_until_when(env, store_url):
    live = start("run", "live", "--", "sleep", "60", env=env)
    try:
        wait_for_holder(store_url, "live")
        ran = tasklock("run", "kept", "--hold-at-least", "60s", "--", "true", env=env)
        assert ran.returncode == 0, ran.stderr
        _peek_says_kept(env)
        _list_says_kept(env)
        conflict = tasklock("run", "kept", "--", "true", env=env)
        assert conflict.returncode == 75
        assert "its command ended: kept by --hold-at-least" in conflict.stderr
    finally:
        live.terminate()
        live.wait()


def _peek_says_kept(env: dict[str, str]) -> None:
    kept = json.loads(tasklock("peek", "kept", "--json", env=env).stdout)
    assert (kept["kept"], kept["kept_until"]) == (True, kept["expires_at"])
    live = json.loads(tasklock("peek", "live", "--json", env=env).stdout)
    assert (live["kept"], live["kept_until"]) == (False, None)
    text = tasklock("peek", "kept", env=env).stdout.splitlines()
    holder = next(line for line in text if line.startswith("holder "))
    assert holder.endswith(", its command has ended"), text
    until = next(line for line in text if line.startswith("kept "))
    # (the expiry of a read: etcd counts it from each read's TTL, so two reads differ)
    assert re.match(r"kept +until \d{4}-[-\d]+T[\d:.]+Z \(in [\d.]+s\) by --hold-at-least", until)
    live_text = tasklock("peek", "live", env=env).stdout
    assert "ended" not in live_text and "\nkept " not in live_text


def _list_says_kept(env: dict[str, str]) -> None:
    listed = json.loads(tasklock("list", "--json", env=env).stdout)
    flags = {entry["key"]: (entry["kept"], entry["kept_until"]) for entry in listed}
    kept_until = next(entry["expires_at"] for entry in listed if entry["key"] == "kept")
    assert flags == {"kept": (True, kept_until), "live": (False, None)}
    rows = [line.split("\t") for line in tasklock("list", env=env).stdout.splitlines()]
    assert {row[0]: row[6] for row in rows} == {"kept": "kept", "live": "held"}  # the state
