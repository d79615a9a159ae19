"""Throwaway TLS certificates for tests (the ``openssl`` command line): a CA, and server
certificates it signs for the names a test chooses."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def require_openssl() -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path) -> Path:
    """A CA (``ca.crt``, ``ca.key`` in ``directory``); its certificate's path."""
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=tasklock test CA",
        cwd=directory,
    )  # fmt: skip
    return directory / "ca.crt"


def make_server_cert(directory: Path, name: str, alt_names: str) -> tuple[Path, Path]:
    """A server certificate and key signed by ``directory``'s CA, for ``alt_names``
    (openssl's subjectAltName, e.g. ``IP:127.0.0.1`` or ``DNS:elsewhere.example``)."""
    extensions = directory / f"{name}.ext"
    extensions.write_text(f"subjectAltName={alt_names}\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", extensions.name,
        cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.crt", directory / f"{name}.key"
