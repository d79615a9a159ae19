"""The MySQL store loads Python's ssl module (OpenSSL) only when a connection uses TLS.

PyMySQL imports ssl when it is imported; the store imports it without (see
``tasklock_cli.stores.mysql.driver``) and keeps PyMySQL's "preferred" TLS with a context made
when the server offers TLS (``connection._PreferredTLS``).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from tasklock_cli.stores.mysql.connection import _Connection
from tasklock_cli.stores.mysql.connection import _PreferredTLS
from tests.support.imports import loaded_after_a_call
from tests.support.imports import python_output

#: Opens the store, makes one call, and says which TLS modules the process loaded.
PROBE = """
import sys
from tasklock_cli.stores import open_store
with open_store(sys.argv[1]) as store:
    store.peek("k")
import pymysql.connections
print("ssl" in sys.modules, pymysql.connections.SSL_ENABLED)
"""


def probe(url: str, prelude: str = "") -> str:
    return python_output(prelude + PROBE, url).strip()


#: What `tasklock`'s entry point does first: this process is the command's own.
AS_THE_COMMAND = "import tasklock_cli.util as util\nutil.own_process = True\n"


def test_a_store_without_tls_never_loads_ssl(mysql_url: str) -> None:
    """This server offers no TLS and the URL asks for none (the test server's set-up)."""
    assert probe(mysql_url, AS_THE_COMMAND) == "False False"


def test_a_program_using_the_api_gets_pymysql_with_ssl(mysql_url: str) -> None:
    """Not the command's process: its own PyMySQL connections may want TLS, so PyMySQL is
    loaded as it is, ssl and all."""
    assert probe(mysql_url) == "True True"


def test_where_ssl_is_already_loaded_pymysql_has_it(mysql_url: str) -> None:
    assert probe(mysql_url, "import ssl\n") == "True True"


@pytest.fixture
def server_context(tmp_path: Path) -> ssl.SSLContext:
    """A TLS server context with a self-signed certificate (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_preferred_tls_makes_its_context_when_the_handshake_wraps(
    server_context: ssl.SSLContext,
) -> None:
    """A real TLS handshake through the lazy context: unverified, as PyMySQL's preferred
    TLS is without a CA, and kept on the connection."""
    connection = _Connection.__new__(_Connection)  # its TLS context only: no server needed
    client, server = socket.socketpair()
    answered: list[bytes] = []

    def serve() -> None:
        with server_context.wrap_socket(server, server_side=True) as tls:
            answered.append(tls.recv(5))
            tls.sendall(b"pong!")

    thread = threading.Thread(target=serve)
    thread.start()
    with _PreferredTLS(connection).wrap_socket(client, server_hostname="localhost") as tls:
        tls.sendall(b"ping!")
        assert tls.recv(5) == b"pong!"
    thread.join(10)
    assert answered == [b"ping!"]
    assert isinstance(connection.ctx, ssl.SSLContext)
    assert connection.ctx.verify_mode == ssl.CERT_NONE


#: The modules PyMySQL's import brings, and the store's own imports could.
DEFERRED = ["traceback", "hashlib", "configparser", "getpass", "urllib.parse", "json",
            "encodings.idna", "ipaddress", "unicodedata", "ssl"]  # fmt: skip


def test_a_plain_call_loads_none_of_what_it_does_not_use(mysql_url: str) -> None:
    """PyMySQL's traceback, hashlib and option file (configparser), and urllib.parse, json
    and the idna codec: a URL without a password, parameters or a non-ASCII host needs
    none of them (``driver``, ``urls``), and neither does a call on a server offering no
    TLS to a user without a password (the test server's set-up)."""
    assert loaded_after_a_call(mysql_url, DEFERRED, AS_THE_COMMAND) == []


def test_the_stand_ins_answer_as_the_modules_do() -> None:
    """PyMySQL's password scrambles and option files, through the stand-ins."""
    code = """
import sys
import tasklock_cli.stores.mysql.driver
from pymysql import _auth
from pymysql.connections import Parser
print(type(_auth.hashlib).__name__, "hashlib" in sys.modules)
print(_auth.scramble_native_password(b"pw", b"x" * 20).hex())
print(_auth.scramble_caching_sha2(b"pw", b"y" * 20).hex())
parser = Parser()
parser.read_string("[client]\\nuser = 'bob'\\n")
print(parser.get("client", "user"))
"""
    lean = run_python(code)
    import hashlib

    native = hashlib.sha1(b"pw").digest()
    expected = bytes(
        a ^ b
        for a, b in zip(
            hashlib.sha1(b"x" * 20 + hashlib.sha1(native).digest()).digest(), native, strict=True
        )
    )
    assert lean.splitlines()[:2] == ["StandIn False", expected.hex()]
    plain = run_python(code.replace("import tasklock_cli.stores.mysql.driver\n", ""))
    assert lean.splitlines()[2:] == plain.splitlines()[2:]
    assert lean.splitlines()[3] == "bob"


def run_python(code: str) -> str:
    return python_output(code).strip()
