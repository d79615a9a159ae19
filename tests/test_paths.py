"""tasklock_cli.util.paths and the plain sqlite:/// URL reading give what pathlib and
urllib.parse give (they stand in for them on `run`'s path)."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from pathlib import PurePosixPath
from urllib.parse import unquote
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import split_url
from tasklock_cli.stores.urls import sqlite_netloc_and_path
from tasklock_cli.stores.urls import sqlite_url
from tasklock_cli.stores.urls import url_scheme
from tasklock_cli.util import paths

#: Every string of up to 6 of these pieces: roots, dots, names.
PIECES = ["/", ".", "..", "a", "b."]
TEXTS = ["".join(p) for n in range(7) for p in itertools.product(PIECES, repeat=n)]


def test_normal_parent_name_and_joined_are_purepath_s():
    for text in TEXTS:
        pure = PurePosixPath(text)
        normal = paths.normal(text)
        assert normal == str(pure), text
        assert paths.parent(normal) == str(pure.parent), text
        assert paths.name(normal) == pure.name, text
        if text:
            assert paths.joined(text, "x", "y.db") == str(pure / "x" / "y.db"), text
        assert sqlite_url(text) == sqlite_url(pure)


def test_with_name_suffix_is_paths_with_name_with_its_error():
    for text in TEXTS:
        path, normal = Path(text), paths.normal(text)
        try:
            expected = str(path.with_name(path.name + ".w"))
        except ValueError as exc:
            with pytest.raises(ValueError, match=f"^{re.escape(str(exc))}$"):
                paths.with_name_suffix(normal, ".w")
        else:
            assert paths.with_name_suffix(normal, ".w") == expected


def test_home_and_is_file_are_paths(tmp_path):
    assert paths.home() == str(Path.home())
    (tmp_path / "f").write_text("")
    for name in ["f", "missing", "f/under", "", "nul\0"]:
        assert paths.is_file(str(tmp_path / name)) == (tmp_path / name).is_file()
        assert paths.is_dir(str(tmp_path / name)) == (tmp_path / name).is_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_is_file_raises_where_path_does(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0)
    try:
        with pytest.raises(PermissionError):
            (closed / "f").is_file()
        with pytest.raises(PermissionError):
            paths.is_file(str(closed / "f"))
    finally:
        closed.chmod(0o700)


def test_make_dir_is_mkdir_exist_ok(tmp_path):
    paths.make_dir(str(tmp_path / "a" / "b" / "c"), parents=True)
    assert (tmp_path / "a" / "b" / "c").is_dir()
    paths.make_dir(str(tmp_path / "a" / "b" / "c"), parents=True)  # exists: fine
    paths.make_dir(str(tmp_path / "a" / "d"))
    with pytest.raises(FileNotFoundError):
        paths.make_dir(str(tmp_path / "x" / "y"))
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        paths.make_dir(str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError):
        paths.make_dir(str(tmp_path / "file" / "z"), parents=True)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///tmp/l.db",
        "sqlite:////tmp//x/./l.db/",
        "sqlite:///",
        "sqlite://",
        "sqlite://host/x.db",
        "sqlite:///a%20b.db",
        "sqlite:///a.db?mode=ro",
        "sqlite:///a.db#frag",
        "sqlite:///a\tb.db",
        "sqlite:///a\nb.db",
        "SQLite:///a.db",
        " sqlite:///a.db",
        "sqlite:///ä.db",
        "sqlite:///[::1].db",
    ],
)
def test_sqlite_urls_read_as_urlsplit_and_unquote_read_them(url):
    parts = urlsplit(url)
    assert sqlite_netloc_and_path(url) == (parts.netloc, unquote(parts.path))
    assert url_scheme(url) == parts.scheme.lower()


#: URLs made of the characters that matter to a split (and some that do not).
_URL_PIECES = st.text(alphabet="ab1:@/?#[]%,.= ", max_size=30)


@given(scheme=st.sampled_from(["etcd", "ETCDS", "redis", "postgresql", "x"]), rest=_URL_PIECES)
def test_split_url_reads_as_urlsplit_wherever_urlsplit_reads_a_url(scheme, rest):
    url = f"{scheme}://{rest}"
    try:
        parts = urlsplit(url)
    except ValueError:  # the netloc checks split_url leaves to the store's own parser
        return
    assert split_url(url) == (parts.scheme, parts.netloc, parts.path, parts.query)


def test_a_list_of_members_with_an_ipv6_address_splits_on_every_python():
    url = "etcd://u:p@a:1,[::1]:2/?prefix=x/"  # urlsplit of Python 3.11.2 refuses it
    assert split_url(url) == ("etcd", "u:p@a:1,[::1]:2", "/", "prefix=x/")
    assert redact_url(url) == "etcd://u:***@a:1,[::1]:2/?prefix=x/"


@given(user=st.text(alphabet="abc", min_size=1), password=st.text(alphabet="xyz", min_size=3))
def test_redact_url_hides_the_password_even_of_a_url_urlsplit_refuses(user, password):
    urls = (
        f"redis://{user}:{password}@[::1:6379/0",
        f"etcds://{user}:{password}@h:1/",
        f"redis://{user}:{password}#{password}@h/0",  # an unencoded '#' in the password
        f"mysql://{user}:{password}?{password}@h/db?table=t",  # '?' (libpq takes it)
        f"postgresql://{user}:{password}/{password}@h/db",  # '/'
        f"redis://{user}:{password}/{password}==@h/0?prefix=a@b",  # base64, '@' in a value
    )
    for url in urls:
        shown = redact_url(url)
        assert password not in shown.replace(user, "")
        assert f"{user}:***@" in shown
