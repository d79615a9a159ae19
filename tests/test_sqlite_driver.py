"""The SQLite store's driver import (``tasklock_cli.stores.sqlite.driver``): in the
`tasklock` command's own process ``_sqlite3`` is imported with a stand-in ``functools``, so a
run loads neither functools nor collections; the statement cache it builds from the stand-in
works; and nobody else ever sees the stand-in.
"""

from __future__ import annotations

import pytest

from tests.support.imports import loaded_after_a_call
from tests.support.imports import python_output

pytestmark = pytest.mark.quick

#: What `tasklock`'s entry point does first: this process is the command's own.
AS_THE_COMMAND = "import tasklock_cli.util as util\nutil.own_process = True\n"
HEAVY = ["functools", "collections", "operator", "reprlib", "keyword"]


def test_the_command_opens_a_store_without_functools(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    assert loaded_after_a_call(url, HEAVY, AS_THE_COMMAND) == []


def test_a_program_using_the_api_imports_the_driver_as_it_is(tmp_path) -> None:
    """Not the command's process: another thread may import functools meanwhile, so
    nothing is stood in for."""
    url = f"sqlite:///{tmp_path}/t.db"
    assert loaded_after_a_call(url, ["functools", "collections"]) == ["functools", "collections"]


#: After the store's import: functools is the real one, and a connection's statement cache
#: (the stand-in's lru_cache: 128 statements, the least recently used dropped) returns the
#: right statement for each of 300 distinct texts, each asked twice, in and out of the cache.
CACHE_PROBE = """
import sys
from tasklock_cli.stores.sqlite.connection import sqlite3
assert "functools" not in sys.modules
import functools
assert functools.partial is not None and functools.reduce(max, [1, 3, 2]) == 3
connection = sqlite3.connect(":memory:")
for round in range(2):
    for n in range(300):
        assert connection.execute(f"SELECT {n}").fetchone() == (n,)
print("ok", type(connection).__module__)
"""


def test_the_stand_in_makes_a_working_statement_cache_and_leaves() -> None:
    assert python_output(AS_THE_COMMAND + CACHE_PROBE).split() == ["ok", "sqlite3"]


def test_where_functools_is_loaded_already_it_is_the_one_used() -> None:
    code = (
        "import functools\n"
        + AS_THE_COMMAND
        + CACHE_PROBE.replace('assert "functools" not in sys.modules\n', "")
    )
    assert python_output(code).split() == ["ok", "sqlite3"]


#: A stand-in asked for another name while it stands in (as a later Python's _sqlite3
#: might ask): the real functools' answer, and the real module in sys.modules from then on.
OTHER_NAME_PROBE = """
import sys
from tasklock_cli.util.lazy import StandIn
stand_in = StandIn("functools")
sys.modules["functools"] = stand_in
reduce = stand_in.reduce
import functools
assert reduce is functools.reduce and sys.modules["functools"] is functools
assert functools is not stand_in
print("ok")
"""


def test_the_stand_in_answers_any_other_name_with_the_real_modules() -> None:
    assert python_output(OTHER_NAME_PROBE).split() == ["ok"]
