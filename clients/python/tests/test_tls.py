"""TLS from Python: a server that requires client certificates, reached with
one (``verify=`` a CA file, ``cert=`` a certificate and key, or the same
from the environment the CLI reads), and every mistake refused at once with
what to do, never retried for seconds as if the node were down."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

import leasehold
from conftest import Server


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(dir: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "30",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", cwd=dir)


def _leaf(dir: Path, ca: str, name: str, *ext: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "30",
             "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=critical,digitalSignature",
             *ext, "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem", "-subj", f"/CN={name}",
             "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", cwd=dir)


@pytest.fixture
def mtls(tmp_path: Path):
    _ca(tmp_path, "ca")
    _ca(tmp_path, "strangers")
    _leaf(tmp_path, "ca", "server", "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "extendedKeyUsage=serverAuth")
    _leaf(tmp_path, "ca", "me", "-addext", "extendedKeyUsage=clientAuth")
    _leaf(tmp_path, "strangers", "stranger", "-addext", "extendedKeyUsage=clientAuth")
    files = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "server", "me", "stranger")}
    keys = {name: str(tmp_path / f"{name}-key.pem") for name in ("server", "me", "stranger")}

    def ready(server: Server) -> bool:
        import ssl

        context = ssl.create_default_context(cafile=files["ca"])
        context.load_cert_chain(files["me"], keys["me"])
        return httpx.get(server.url + "/health", verify=context, timeout=1).status_code == 200

    server = Server(
        ["--tls-cert", files["server"], "--tls-key", keys["server"], "--tls-client-ca", files["ca"]],
        scheme="https",
        ready=ready,
    )
    try:
        yield server, files, keys
    finally:
        server.stop()


def test_a_client_certificate_is_presented_and_every_mistake_says_what_to_do(mtls, monkeypatch):
    server, files, keys = mtls
    for var in ("LEASEHOLD_CACERT", "LEASEHOLD_CLIENT_CERT", "LEASEHOLD_CLIENT_KEY"):
        monkeypatch.delenv(var, raising=False)
    me = (files["me"], keys["me"])
    with leasehold.Client(server.url, verify=files["ca"], cert=me).try_lock("tls/a", ttl=5) as lease:
        assert lease.token() > 0

    # The same from the environment, as the CLI reads it.
    monkeypatch.setenv("LEASEHOLD_CACERT", files["ca"])
    monkeypatch.setenv("LEASEHOLD_CLIENT_CERT", files["me"])
    monkeypatch.setenv("LEASEHOLD_CLIENT_KEY", keys["me"])
    with leasehold.Client(server.url).try_lock("tls/b", ttl=5) as lease:
        assert lease.token() > 0
    for var in ("LEASEHOLD_CACERT", "LEASEHOLD_CLIENT_CERT", "LEASEHOLD_CLIENT_KEY"):
        monkeypatch.delenv(var)

    plain = server.url.replace("https://", "http://")
    mistakes = [
        (dict(url=server.url, verify=files["ca"]), leasehold.Unavailable, "requires a client certificate"),
        (dict(url=server.url, verify=files["ca"], cert=(files["stranger"], keys["stranger"])),
         leasehold.Unavailable, "does not accept this client certificate"),
        (dict(url=server.url, cert=me), leasehold.Unavailable, "not signed by a CA this client trusts"),
        (dict(url=plain), leasehold.TlsRequired, "TLS"),
    ]
    for args, error, says in mistakes:
        started = time.monotonic()
        with pytest.raises(error) as refused:
            leasehold.Client(**args).try_lock("tls/c", ttl=5)
        assert says in str(refused.value), (args, refused.value)
        assert time.monotonic() - started < 2, f"{args}: refused after {time.monotonic() - started:.1f} s"


def test_missing_tls_files_are_a_clear_error(tmp_path):
    with pytest.raises(leasehold.InvalidArgument) as bad:
        leasehold.Client("https://127.0.0.1:1", verify=str(tmp_path / "absent.pem"))
    assert "absent.pem" in str(bad.value)
