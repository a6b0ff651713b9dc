"""A real `mnemosyne serve` for the SDK end-to-end tests.

One server per test session, over a fresh PostgreSQL database, with data under a
namespace unique to the run (the graph store is shared with everyone else):

  workspace A  `py_<hex>_ws`        two documents that contain the run's word
  workspace B  `py_<hex>_other_ws`  one document that contains it too; no
                                    credential handed to the tests may see it
  a team attached to workspace A (its JWT), and an opaque token of a user who
  owns workspace A's library.

Everything listens on 127.0.0.1. Teardown deletes the run's workspaces from the
graph, stops the server (SIGTERM, bounded) and drops the database.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx2
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/mnemosyne"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 120.0
SEED_RETRY_S = 20.0


@dataclass(frozen=True)
class Document:
    title: str
    content: str


@dataclass(frozen=True)
class Stack:
    """What the tests get: a running server and credentials into it."""

    base_url: str
    mcp_url: str
    #: A word that occurs in this run's seeded documents and nowhere else.
    word: str
    #: Workspace A: visible to both credentials below.
    workspace: str
    library_uid: str
    documents: tuple[Document, ...]
    item_uids: frozenset[str]
    #: Workspace B: holds the word too, visible to neither credential.
    other_workspace: str
    other_library_uid: str
    opaque_token: str
    team_jwt: str
    team_id: str
    service_user: str
    service_password: str
    #: The owner of workspace A's library (the opaque token's user).
    reader: str
    #: The binary and the environment its CLI runs with (this run's database).
    binary: str
    cli_env: dict[str, str]
    #: A certificate (and its key) for https://127.0.0.1, issued by a test
    #: authority the server trusts for Client ID Metadata Documents
    #: (MNEMOSYNE_OAUTH_METADATA_CA_FILE): a test serves a document with it.
    tls_cert: str
    tls_key: str

    def cli(self, *args: str) -> str:
        """Runs `mnemosyne <args>` against this run's database; its stdout."""
        return _run([self.binary, *args], self.cli_env)


def _dev_env() -> dict[str, str]:
    """`.dev/env` (written by scripts/dev), as the binary would read it."""
    out: dict[str, str] = {}
    path = ROOT / ".dev" / "env"
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def _with_database(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + db))


def _psql() -> str:
    found = shutil.which("psql") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)), None)
    if not found:
        pytest.exit("psql not found (scripts/dev up installs PostgreSQL)", returncode=2)
    return found


def _run(cmd: list[str], env: dict[str, str], stdin: str | None = None) -> str:
    r = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r.stdout


def _test_authority(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway certificate authority and a certificate it issued for
    127.0.0.1 (an hour long): the CA file, the certificate, its key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mnemosyne pytest CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = workdir / "ca.pem", workdir / "localhost.pem", workdir / "localhost-key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_file, cert_file, key_file


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    with httpx2.Client(trust_env=False, timeout=2.0) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"mnemosyne serve exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                r = http.get(f"{base_url}/readyz")
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:300]}"
            except httpx2.TransportError as e:
                last = repr(e)
            time.sleep(0.1)
    raise RuntimeError(f"/readyz not 200 within {READY_TIMEOUT_S:.0f} s (last: {last}):\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    binary = os.environ.get("MNEMOSYNE_BIN", str(ROOT / "target" / "debug" / "mnemosyne"))
    if not os.access(binary, os.X_OK):
        pytest.exit(f"no mnemosyne binary at {binary} (cargo build --bin mnemosyne, or set MNEMOSYNE_BIN)", returncode=2)

    # Explicit environment wins over .dev/env, as in the binary.
    base_url = os.environ.get("MNEMOSYNE_DATABASE_URL") or _dev_env().get("MNEMOSYNE_DATABASE_URL") or DEFAULT_DATABASE_URL
    admin_url = _with_database(base_url, "postgres")
    run = secrets.token_hex(6)
    db = f"mnemosyne_pytest_{run}"
    env = dict(os.environ)
    env["MNEMOSYNE_DATABASE_URL"] = _with_database(base_url, db)
    psql = _psql()
    try:
        _run([psql, admin_url, "-v", "ON_ERROR_STOP=1", "-qAtc", f'CREATE DATABASE "{db}"'], env)
    except RuntimeError as e:
        raise RuntimeError(f"cannot create the test database; are the dev services up (scripts/dev up)?\n{e}") from None

    workdir = Path(tempfile.mkdtemp(prefix="mnemosyne-pytest-"))
    log = workdir / "serve.log"
    ca_file, tls_cert, tls_key = _test_authority(workdir)
    proc: subprocess.Popen[bytes] | None = None
    http: httpx2.Client | None = None
    workspaces: list[str] = []
    try:
        _run([binary, "migrate"], env)
        service_user = f"py-svc-{run}"
        service_password = secrets.token_urlsafe(24)
        _run([binary, "user", "create", service_user, "--service", "--password-stdin"], env, stdin=service_password + "\n")

        for attempt in range(3):
            # The port is free now; another process may take it before serve
            # binds it. Then serve exits at once, and we try another port.
            port = _free_port()
            base = f"http://127.0.0.1:{port}"
            serve_env = dict(
                env,
                MNEMOSYNE_LISTEN=f"127.0.0.1:{port}",
                MNEMOSYNE_PUBLIC_URL=base,
                MNEMOSYNE_OAUTH_METADATA_CA_FILE=str(ca_file),
                NO_COLOR="1",
            )
            with log.open("wb") as out:
                proc = subprocess.Popen([binary, "serve"], cwd=ROOT, env=serve_env, stdout=out, stderr=subprocess.STDOUT)
            try:
                _wait_ready(proc, base, log)
                break
            except RuntimeError:
                if proc.poll() is None or attempt == 2:
                    raise

        http = httpx2.Client(base_url=base, auth=(service_user, service_password), trust_env=False, timeout=30.0)

        def post(path: str, body: dict, want: tuple[int, ...] = (200, 201)) -> dict:
            # 503 means a store did not answer in time ("retry later"): the
            # graph is shared with whoever else is testing, so retry, bounded.
            # Ingest is idempotent (same content: "unchanged").
            deadline = time.monotonic() + SEED_RETRY_S
            while True:
                r = http.post(path, json=body)
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code in want, f"POST {path}: {r.status_code} {r.text}"
            return r.json()

        word = f"quokka{run}"
        ws_a = f"py_{run}_ws"
        ws_b = f"py_{run}_other_ws"
        workspaces += [ws_a, ws_b]
        docs = (
            Document(
                "Harbour ledger",
                f"# Harbour ledger\n\nThe harbour master noted a {word} near the pier at dawn. Tides were calm.",
            ),
            Document(
                "Lighthouse diary",
                f"# Lighthouse diary\n\nFrom the lamp room the keeper saw the {word} again, swimming north.",
            ),
        )
        item_uids = set()
        lib_a = None
        for d in docs:
            out = post("/library/api/ingest/", {"workspace_id": ws_a, "item": {"title": d.title}, "content": d.content})
            assert out["chunk_count"] >= 1, out
            lib_a = lib_a or out["library_uid"]
            assert out["library_uid"] == lib_a, out
            item_uids.add(out["item_uid"])
        other = post(
            "/library/api/ingest/",
            {"workspace_id": ws_b, "item": {"title": "Secret almanac"},
             "content": f"# Secret almanac\n\nOnly the other workspace knows the {word} sleeps here."},
        )
        lib_b = other["library_uid"]
        assert lib_b != lib_a

        team_id = str(uuid.uuid4())
        r = http.post("/mcp_server/api/teams/", json={"id": team_id, "name": f"pytest team {run}"})
        assert r.status_code == 201, f"create team: {r.status_code} {r.text}"
        team_jwt = r.json()["jwt"]
        r = http.put(f"/mcp_server/api/teams/{team_id}/workspaces/", json={"workspace_ids": [ws_a]})
        assert r.status_code == 200 and r.json() == {"workspace_ids": [ws_a]}, f"{r.status_code} {r.text}"

        reader = f"py-user-{run}"
        _run([binary, "user", "create", reader], env)
        _run([binary, "membership", "grant", reader, lib_a, "owner"], env)
        out = _run([binary, "token", "create", "--user", reader, "--library", lib_a, "--name", "pytest"], env)
        opaque = out.strip().splitlines()[-1].strip()
        assert opaque.startswith("mnm_"), out

        yield Stack(
            base_url=base,
            mcp_url=f"{base}/mcp/",
            word=word,
            workspace=ws_a,
            library_uid=lib_a,
            documents=docs,
            item_uids=frozenset(item_uids),
            other_workspace=ws_b,
            other_library_uid=lib_b,
            opaque_token=opaque,
            team_jwt=team_jwt,
            team_id=team_id,
            service_user=service_user,
            service_password=service_password,
            reader=reader,
            binary=binary,
            cli_env=env,
            tls_cert=str(tls_cert),
            tls_key=str(tls_key),
        )
    finally:
        try:
            if http is not None:
                if proc is not None and proc.poll() is None:
                    for ws in workspaces:
                        try:
                            http.delete(f"/library/api/workspaces/{ws}/")
                        except httpx2.HTTPError:
                            pass
                http.close()
        finally:
            if proc is not None:
                _stop(proc)
            subprocess.run(
                [psql, admin_url, "-qAtc", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'],
                cwd=ROOT, env=env, capture_output=True, timeout=CLI_TIMEOUT_S,
            )
            if request.session.testsfailed or sys.exc_info()[0] is not None:
                print(f"\nmnemosyne serve log kept at {log}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
