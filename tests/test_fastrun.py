"""The fast `run` parser: what it takes itself, and what it leaves to typer unchanged (the
behaviour of both paths through the real executable is in test_cli_run.py and
test_cli_global_options.py)."""

from __future__ import annotations

import pytest

from tasklock_cli.cli.fastrun import parse
from tests.support.blocked_imports import attempts
from tests.support.blocked_imports import env_without
from tests.support.cli import python
from tests.support.cli import tasklock

#: Modules a plain `run` on SQLite must not import: the CLI framework and the network
#: drivers, and what costs start-up time for nothing (issues 18 and 45): dataclasses (with
#: inspect, ast, dis, tokenize), typing, traceback (with textwrap), the ctypes package,
#: pathlib and urllib (with ipaddress), getpass (with termios), subprocess (with locale and
#: selectors: the guard uses os.posix_spawnp), importlib (with warnings), unicodedata (only
#: for a key that is not printable), socket (its enums; _socket does), and what serves other
#: commands: logging, random, hashlib, shutil, tempfile, uuid, platform; signal (its enums:
#: util.signals takes the same from _signal), re (durations are read by hand) and json
#: (util.jsontext writes and reads on _json, json's C half; the json package imports re), enum
#: (ExitCode and LossKind are plain ints and strings; signal, re and json imported it);
#: datetime (util.times takes the classes from _datetime, its C half) and the sqlite3 package
#: (whose dbapi2 imports datetime: the SQLite store uses _sqlite3, the package's C half),
#: threading (util.threads: the heartbeat on _thread), math (util.durations.INFINITY),
#: contextlib (util.suppressed; the SQLite store's write transaction is a class), functools
#: with collections, operator, keyword, reprlib and types (_sqlite3 reads functools.lru_cache
#: as it is imported: stores.sqlite.driver hands it a stand-in; collections.abc is imported
#: for the type checker only).
NOT_ON_RUNS_PATH = {
    "typer", "click", "rich", "psycopg", "redis", "pymysql", "secrets", "tomllib", "tomli",
    "_hashlib", "dataclasses", "inspect", "ast", "dis", "tokenize", "typing", "traceback",
    "textwrap", "ctypes", "pathlib", "urllib", "ipaddress", "getpass", "termios",
    "subprocess", "locale", "selectors", "_posixsubprocess", "importlib", "warnings",
    "unicodedata", "socket", "logging", "random", "hashlib", "shutil", "tempfile", "uuid",
    "platform", "signal", "re", "sre_compile", "sre_parse", "sre_constants", "json", "enum",
    "datetime", "sqlite3", "threading", "math", "contextlib", "functools", "collections",
    "operator", "keyword", "reprlib", "types",
}  # fmt: skip

#: The import budget (issue 45): every module of tasklock's own that a plain `run` on SQLite
#: imports, by name. Each is used by that run; a module added to the path (a new import, or
#: one made late that comes back) fails the test until it is named here, on purpose.
#: Not here, among others: cli.app (typer), commands, run.windows (--once-per), the store
#: doctor modules, and every other store.
OURS_ON_RUNS_PATH = {
    "tasklock_cli", "tasklock_cli.cli", "tasklock_cli.cli.argv", "tasklock_cli.cli.entry",
    "tasklock_cli.cli.fastrun", "tasklock_cli.cli.session", "tasklock_cli.config",
    "tasklock_cli.config.file", "tasklock_cli.config.settings",
    "tasklock_cli.errors", "tasklock_cli.events", "tasklock_cli.proc", "tasklock_cli.proc.guard",
    "tasklock_cli.proc.process", "tasklock_cli.proc.proctree", "tasklock_cli.proc.protocol",
    "tasklock_cli.run", "tasklock_cli.run.announce", "tasklock_cli.run.command",
    "tasklock_cli.run.environment", "tasklock_cli.run.heartbeat",
    "tasklock_cli.run.holding", "tasklock_cli.run.keeper", "tasklock_cli.run.options",
    "tasklock_cli.run.schedule", "tasklock_cli.run.supervisor", "tasklock_cli.run.waiter",
    "tasklock_cli.stores", "tasklock_cli.stores.base", "tasklock_cli.stores.model",
    "tasklock_cli.stores.queueing",
    "tasklock_cli.stores.registry", "tasklock_cli.stores.rows", "tasklock_cli.stores.sqlite",
    "tasklock_cli.stores.sqlite.breaks", "tasklock_cli.stores.sqlite.connection",
    "tasklock_cli.stores.sqlite.driver",
    "tasklock_cli.stores.sqlite.entries", "tasklock_cli.stores.sqlite.files",
    "tasklock_cli.stores.sqlite.processes", "tasklock_cli.stores.sqlite.queue",
    "tasklock_cli.stores.sqlite.reads",
    "tasklock_cli.stores.sqlite.schema", "tasklock_cli.stores.sqlite.store",
    "tasklock_cli.stores.sqlite.waiting", "tasklock_cli.stores.traits", "tasklock_cli.stores.urls",
    "tasklock_cli.util",
    "tasklock_cli.util.clock", "tasklock_cli.util.durations", "tasklock_cli.util.fds",
    "tasklock_cli.util.imports", "tasklock_cli.util.jsontext",
    "tasklock_cli.util.keys", "tasklock_cli.util.lazy", "tasklock_cli.util.paths",
    "tasklock_cli.util.records", "tasklock_cli.util.sanitize", "tasklock_cli.util.signals",
    "tasklock_cli.util.threads", "tasklock_cli.util.times",
}  # fmt: skip

#: The standard library's part of the budget, by top-level name: _sqlite3 (whose import
#: gets a stand-in functools: stores.sqlite.driver), _functools, _datetime, _json, select and
#: _socket, and pwd, _ctypes (prctl), _sha256 (_sha2 from 3.12; the FIFO names), gc (built
#: in). 14 on 3.11.
STDLIB_ON_RUNS_PATH = {
    "__future__", "_ctypes", "_datetime", "_functools", "_json",
    "_sha2", "_sha256", "_signal", "_socket", "_sqlite3",
    "errno", "gc", "pwd", "select",
}  # fmt: skip
#: At most this many modules in all (94 on Python 3.11 when it was set; 96 since
#: stores.traits split from stores.base on main, c54f74c: that commit did not name it; 97
#: since the supervisor's event wording and the command's environment became modules of
#: their own, run.announce and run.environment (issue 42): 95 before, one under the budget;
#: 98 since the renewal schedule left run.heartbeat for run.schedule, so that the heartbeat
#: can take RunOptions typed: run.options imported it back; 100 since stores.queueing, the
#: waiter's side of the interface, left stores.base, and stores.sqlite.reads, the SQLite
#: store's reads, left its class for its size; 90 since signal, re and json left the path,
#: issue 45: 100 before, with util.signals and util.jsontext added; 89 since enum left it;
#: 84 since datetime, the sqlite3 package, threading and math left it, util.threads added;
#: 82 since run.conflict and config.lines are imported where a conflict or a bad setting is;
#: 81 since contextlib left it; 72 since functools, collections and what they import left
#: it, stores.sqlite.driver added; 73 since util.imports, the finder of the rest, 0.96 of a
#: run's time).
RUN_IMPORT_BUDGET = 73


def test_a_plain_run_with_global_options_on_both_sides():
    parsed = parse(
        ["--store", "sqlite:///x.db", "-v", "run", "k", "--ttl=5s", "--note", "-v",
         "--conflict-exit-code", "0", "-q", "--log-format", "json", "--", "cmd", "--ttl", "1"]
    )  # fmt: skip
    assert parsed is not None
    assert parsed.before == {"store": "sqlite:///x.db", "verbose": 1}
    assert parsed.after == {"quiet": True, "log_format": "json"}
    assert parsed.key == "k"
    assert parsed.flags == {"ttl": "5s", "conflict-exit-code": 0}
    assert parsed.note == "-v"  # a value, not an option
    assert parsed.command == ["cmd", "--ttl", "1"]  # after --: the command's


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["run", "--help"],
        ["run", "k", "--help", "--", "true"],
        ["peek", "k"],
        ["run", "k", "true"],  # no --
        ["run", "--", "true"],  # no key
        ["run", "k", "--"],  # no command
        ["run", "k", "j", "--", "true"],  # a second positional
        ["run", "k", "--bogus", "--", "true"],
        ["run", "k", "--ttl"],  # value missing
        ["run", "k", "--conflict-exit-code", "x", "--", "true"],
        ["--version"],
        ["-vq", "run", "k", "--", "true"],  # combined short flags
        ["--verbose=1", "run", "k", "--", "true"],
    ],
)
def test_anything_else_goes_to_typer(args):
    assert parse(args) is None


def run_imports(env: dict[str, str], args: list[str]) -> tuple[int, list[str]]:
    """The exit code of ``tasklock ARGS`` through the real entry point, in a subprocess, and
    the modules it imported, counted from the moment the interpreter is up: what site
    imported before (an editable install's finder, say) is not the run's."""
    code = (
        "import os, sys\n"
        "before = set(sys.modules)\n"
        "me, exit_now = os.getpid(), os._exit\n"
        "def report(code):\n"  # the guard (forked) exits through os._exit too: not it
        "    if os.getpid() == me:\n"
        "        print(code, *sorted(set(sys.modules) - before), flush=True)\n"
        "    exit_now(code)\n"
        "os._exit = report\n"
        "from tasklock_cli.cli.entry import main\n"
        f"main({args!r})\n"
    )
    result = python(code, env)
    assert result.stdout, result.stderr
    exit_code, *imported = result.stdout.splitlines()[-1].split()
    return int(exit_code), imported


def test_a_plain_run_on_sqlite_imports_only_what_it_needs(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    code, imported = run_imports(env, ["run", "k", "--ttl", "5s", "--", "true"])
    assert code == 0
    assert "tasklock_cli.stores.sqlite.store" in imported  # it did run
    assert not {name.split(".")[0] for name in imported} & NOT_ON_RUNS_PATH


def test_the_installed_executable_runs_with_those_modules_missing(cli_env, sqlite_url, tmp_path):
    """The `tasklock` script itself, as installed, with every module run must not import
    made unimportable: the run succeeds and never tried one (its guard included). The
    script is ours (bin/tasklock), whatever pip installed it: an entry point's script from
    pip before 25.0 would import ``re``."""
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    blocked = env_without(sorted(NOT_ON_RUNS_PATH), env, tmp_path)
    result = tasklock("run", "k", "--", "true", env=blocked)
    assert result.returncode == 0, result.stderr
    assert attempts(blocked) == []


def test_a_plain_run_on_sqlite_keeps_within_its_import_budget(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    code, imported = run_imports(env, ["run", "k", "--ttl", "5s", "--", "true"])
    assert code == 0
    ours = {name for name in imported if name.split(".")[0] == "tasklock_cli"}
    assert ours - OURS_ON_RUNS_PATH == set(), "new on run's path: name them in the budget"
    assert OURS_ON_RUNS_PATH - ours == set(), "off run's path now: take them out of the budget"
    stdlib = {name.split(".")[0] for name in imported} - {"tasklock_cli"}
    assert stdlib - STDLIB_ON_RUNS_PATH == set(), "new on run's path: name them in the budget"
    assert len(imported) <= RUN_IMPORT_BUDGET


def test_version_alone_imports_nothing_of_the_command_line(cli_env):
    code, imported = run_imports(cli_env, ["--version"])
    assert code == 0
    assert set(imported) <= {
        "__future__",
        "gc",
        "tasklock_cli",
        "tasklock_cli.cli",
        "tasklock_cli.cli.entry",
    }


def test_the_guard_is_forked_before_the_store_is_opened(cli_env, sqlite_url):
    """The command's guard is forked before the store's package and driver are imported
    (run.command): a smaller fork (a third of the page tables with psycopg), and the
    driver's pages the wrapper's alone. The guard, as it exits, has none of them, and its
    garbage collector on (the wrapper forks it with the collector off: it imports without)."""
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    code = (
        "import gc, os, sys\n"
        "me, exit_now = os.getpid(), os._exit\n"
        "def report(code):\n"
        "    role = 'wrapper' if os.getpid() == me else 'guard'\n"
        "    loaded = sorted(name for name in sys.modules if '.stores.sqlite' in name)\n"
        "    print(role, gc.isenabled(), *loaded, flush=True)\n"
        "    exit_now(code)\n"
        "os._exit = report\n"
        "from tasklock_cli.cli.entry import main\n"
        "main(['run', 'k', '--', 'true'])\n"
    )
    result = python(code, env)
    lines = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}
    assert set(lines) == {"wrapper", "guard"}, result.stdout + result.stderr
    assert "tasklock_cli.stores.sqlite.store" in lines["wrapper"]
    assert lines["guard"] == ["True"]
