"""``stores.urls``' readings of a URL without ``urllib.parse`` (a start-up cost) answer as
urllib.parse and the ``idna`` codec do, for every text."""

from __future__ import annotations

from urllib.parse import parse_qsl
from urllib.parse import unquote
from urllib.parse import unquote_plus
from urllib.parse import urlsplit

from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.stores import urls

#: URL-ish texts: what a URL is made of, with some of everything else.
TEXT = st.text(st.sampled_from("aZ09+-.:/@?#&=%[]_ \t\né2F") | st.characters(), max_size=40)


@given(TEXT)
@example("mysql://root@127.0.0.1:3306/test")
@example("MySQL+x.y-1://h/d")
@example("1mysql://h/d")
@example(" mysql://h/d")
@example("my\tsql://h/d")
@example("mysql:/h://x")
def test_url_scheme(url: str) -> None:
    try:
        expected = urlsplit(url).scheme.lower()
    except ValueError:
        expected = url.partition(":")[0].lower()
    assert urls.url_scheme(url) == expected


@given(TEXT)
@example("mysql://[::1/d")
@example("mysql://h]/d")
@example("mysql://é/d")
def test_url_syntax_problem(url: str) -> None:
    try:
        urlsplit(url)
    except ValueError as exc:
        assert urls.url_syntax_problem(url) == str(exc)
    else:
        assert urls.url_syntax_problem(url) is None


@given(TEXT)
@example("a" * 63 + ".b")
@example("a" * 64 + ".b")
@example("b." + "a" * 64)
@example("a..b")
@example("a.")
@example(".a")
@example("/\ud800")
def test_host_problem(host: str) -> None:
    if host.startswith("/"):  # a socket path, no host name: what it lacks, the connect says
        assert urls.host_problem(host) is None
        return
    try:
        host.encode("idna")
    except UnicodeError:
        assert urls.host_problem(host) is not None
    else:
        assert urls.host_problem(host) is None


@given(TEXT)
@example("a%2Fb+c")
@example("%zz+%")
def test_unquote(text: str) -> None:
    assert urls.unquote(text) == unquote(text)
    assert urls.unquote_plus(text) == unquote_plus(text)


@given(TEXT)
@example("table=x&ssl_ca=%2Fa+b&flag&=v&&x=1&x=2")
def test_query_parameters(query: str) -> None:
    assert urls.query_parameters(query) == dict(parse_qsl(query, keep_blank_values=True))
