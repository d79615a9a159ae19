"""Random command lines through the real executable: mutations of valid ones (odd and malformed
store URLs of every scheme, huge and negative numbers, Unicode digits (``²``, ``٣``), host
labels of 64+ characters, empty strings, unicode, options in odd places). Whatever the
input: no traceback (no -v is given), no hang, and only exit codes the contract documents.
Bounded so that it runs in CI in well under a minute."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tasklock_cli.stores.provisioning import with_query
from tests.support import services
from tests.support.cli import executable

#: Each command line must end within this (etcd URLs point at a refused port, PostgreSQL and
#: Redis are local): longer is a hang.
TIMEOUT_S = 15
#: The children are `true`, `echo` and `sh -c "exit 3"`: their codes are known (sh reports
#: a broken script with 2, which is also the usage error's).
CHILD_CODES = {0, 3}
#: The contract's exit codes of tasklock itself (1 only from `peek`: free).
TASKLOCK_CODES = {0, 2, 69, 70, 75, 78, 126, 127}

#: A host label of 64 characters: Python's resolver (idna) refuses it.
LONG_LABEL = "a" * 64 + ".example"
ODD_VALUES = [
    "", " ", "-", "--", "=", "-1", "0", "1", "00", "999999999999999999999",
    "-999999999999999999999", "99999999999999999999999", "9" * 400, "--5", "--1", "+5", "5_0",
    "1e308", "nan", "inf", "-inf", "0x10", "5s5", "1h-1m", "٣", "²", "²s", "1²", "٣d", "é",
    "\u202e", "\udcff", "ß" * 64, "x" * 2000, "%00", "%zz", "[", "]", "[::1", "a b", "k\nk",
    "*", "?", "#", LONG_LABEL, "36501d", "99999999999999999999999h",
]  # fmt: skip
#: Options of every command, placed anywhere (no -v: a traceback is what -v asks for; no
#: --watch or --hold-at-least: those run as long as asked).
OPTIONS = [
    "--ttl", "--renew-every", "--wait", "--grace", "--max-lifetime", "--once-per", "--limit",
    "--note", "--json", "--prefix", "--all", "--token", "--dry-run", "--force", "--print-sql",
    "--interval", "--store", "--config", "--log-format", "-q", "--quiet", "--bogus", "-x", "-vq",
    "--help", "--ttl=", "--limit=0", "--store=", "--shared", "--also", "--also=", "--replace",
    "--supersede", "--conflict-exit-code", "--done-exit-code", "--priority", "--max-waiting",
    "--limit=²", "--done-exit-code=--1",
]  # fmt: skip
SCHEMES = [
    "sqlite", "postgresql", "postgres", "redis", "rediss", "unix", "etcd", "etcds", "mysql",
    "mariadb", "redis+sentinel", "rediss+sentinel", "",
]  # fmt: skip
NETLOCS = [
    "", "127.0.0.1", "127.0.0.1:1", "[::1", "[::1]:1", "[::1]", ":99999", "h:abc", "u:p@",
    "%zz@127.0.0.1", "127.0.0.1:1,", "127.0.0.1:1,127.0.0.1:2", "nosuchhost.invalid",
    "127.0.0.1:²", "127.0.0.1:٣", "h:99999999999999999999999", f"{LONG_LABEL}:1",
    f"u:p@{LONG_LABEL}", f"127.0.0.1:1,{LONG_LABEL}:2", "[zz]:1", "a..b:1", "u:p?w@127.0.0.1:1",
]  # fmt: skip
PATHS = [
    "", "/", "//", "/x.db", "/99", "/abc", "/-1", "/0/", "/%00", "/tmp/", "/é.db", "/%C2%B2",
    "/svc/%C2%B2", "/99999999999999999999999",
]  # fmt: skip
QUERIES = [
    "", "?", "?bogus=1", "?db=x", "?db=99", "?prefix=", "?prefix=p", "?table=", "?table=a.b.c",
    "?mode=0660", "?socket_timeout=-1", "?cacert=/nonexistent", "#frag", "?a=1&a=2",
    "?wait_replicas=%C2%B2", "?wait_replicas=99999999999999999999999", "?db=%D9%A3",
    f"?host={LONG_LABEL}", "?port=%C2%B2", "?socket_timeout=1e999", "?pass%77ord=x",
]  # fmt: skip


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> Iterator[list[str]]:
    """Valid URLs of the stores this machine has (all of them in CI)."""
    tag = uuid.uuid4().hex[:8]
    found = [f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/locks.db"]
    for kind, make in (
        ("postgres", lambda: with_query(services.base_url("postgres"), table=f"fuzz_{tag}")),
        ("redis", lambda: with_query(services.base_url("redis"), prefix=f"fuzz-{tag}:")),
        ("mysql", lambda: with_query(services.base_url("mysql"), table=f"fuzz_{tag}")),
    ):
        if services.unavailable_reason(kind) is None:
            found.append(make())
        elif services.in_ci():
            services.require(kind)
    found.append("etcd://127.0.0.1:1")  # refused: answered at once
    yield found
    for url in found[1:-1]:
        services.cleanup(url.split(":", 1)[0].replace("postgresql", "postgres"), url)


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("fuzz-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLOCK_")}
    env.update(
        XDG_STATE_HOME=str(home / "state"), XDG_CONFIG_HOME=str(home / "config"), NO_COLOR="1"
    )
    return env


odd_urls = st.builds(
    lambda scheme, netloc, path, query: f"{scheme}://{netloc}{path}{query}" if scheme else netloc,
    st.sampled_from(SCHEMES),
    st.sampled_from(NETLOCS),
    st.sampled_from(PATHS),
    st.sampled_from(QUERIES),
)


def templates(url: str, key: str) -> list[list[str]]:
    store = ["--store", url]
    return [
        [*store, "run", key, "--ttl", "5s", "--", "true"],
        ["run", key, *store, "echo", "-n", "hi", "--note", "x"],
        ["run", "--wait", "1s", key, "--limit", "2", *store, "sh", "-c", "exit 3"],
        ["run", key, "--once-per", "1h", *store, "--", "true"],
        [*store, "peek", key, "--json"],
        [*store, "list", "--prefix", key],
        ["history", key, "--limit", "3", *store, "--json"],
        [*store, "sweep", "--dry-run", "--json"],
        ["check", key, "--token", "1", *store],
        [*store, "doctor", "--json"],
        [*store, "metrics", "--prefix", key],
        [*store, "init", "--print-sql"],
        [*store, "release", key, "--force"],
        [*store, "--log-format", "json", "peek", key],
    ]


@st.composite
def command_lines(draw, urls: list[str]) -> list[str]:
    key = f"fuzz-{uuid.uuid4().hex[:8]}"
    argv = list(draw(st.sampled_from(templates(draw(st.sampled_from(urls)), key))))
    words = st.one_of(st.sampled_from(ODD_VALUES), st.sampled_from(OPTIONS), odd_urls)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(argv)))
        mutation = draw(st.sampled_from(["replace", "insert", "delete", "url"]))
        if mutation == "insert" or not argv:
            argv.insert(at, draw(words))
        elif mutation == "delete":
            del argv[min(at, len(argv) - 1)]
        elif mutation == "url" and "--store" in argv[:-1]:
            argv[argv.index("--store") + 1] = draw(odd_urls)
        else:
            argv[min(at, len(argv) - 1)] = draw(words)
    return argv


def check_outcome(argv: list[str], result: subprocess.CompletedProcess) -> None:
    shown = f"argv={argv!r}\nexit {result.returncode}\nstderr={result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr, shown
    allowed = TASKLOCK_CODES | CHILD_CODES
    if "peek" in argv:
        allowed = allowed | {1}
    assert result.returncode in allowed, shown
    if result.returncode in (69, 78) and result.stderr:  # doctor reports on stdout
        last = result.stderr.strip().splitlines()[-1]
        if last.startswith("{"):
            assert json.loads(last)["event"] == "error", shown
        else:
            assert last.startswith("tasklock: error: "), shown
        assert "\n" not in last


@pytest.mark.slow
def test_no_command_line_gets_a_traceback_a_hang_or_an_undocumented_code(urls, fuzz_env):
    @settings(
        max_examples=int(os.environ.get("TASKLOCK_FUZZ_EXAMPLES", "120")),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(command_lines(urls))
    def one(argv: list[str]) -> None:
        try:
            result = subprocess.run(
                [executable(), *argv],
                env=fuzz_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no answer within {TIMEOUT_S}s: argv={argv!r}") from None
        check_outcome(argv, result)

    one()
