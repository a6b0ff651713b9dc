"""The MCP authorization flow through the official Python SDK's OAuth client
(`mcp.client.auth.OAuthClientProvider`, issue 48).

The SDK is given nothing but the server's URL: it follows the 401 to the
protected-resource metadata, the authorization-server metadata, registers
(DCR, `token_endpoint_auth_method: none`, a loopback redirect), and sends the
person to the authorization URL. The person is played by a cookie-keeping
HTTP client that signs in on the console and approves ONE of two libraries on
the consent page (the WebDriver test does the same with a real browser); the
SDK then lists and searches exactly that library, refreshes its token, and a
revoked grant answers 401 on the next request.

The SDK's Client ID Metadata Document support (`client_metadata_url`) is
exercised too: the test serves the client's document over https on
127.0.0.1 (a certificate from a test authority the server is told to trust),
and the SDK uses the URL as its client_id instead of registering.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from conftest import Stack

pytestmark = pytest.mark.anyio

DEADLINE_S = 60.0
PASSWORD = "oauth-person-password-123"
REDIRECT = "http://127.0.0.1:33418/callback"


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def _hidden(html: str, name: str) -> str:
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert m, f"no {name} field in the page"
    return m.group(1)


class Person:
    """A browser without JavaScript: signs in on the console and answers the
    consent page, granting `library` only."""

    def __init__(self, base_url: str, username: str, library: str) -> None:
        self.base = base_url
        self.username = username
        self.library = library
        self.result: AuthorizationCodeResult | None = None
        self.consent_pages: list[str] = []

    async def approve(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, trust_env=False, timeout=20.0) as b:
            r = await b.get(authorization_url)
            assert r.status_code == 303, r.text
            consent = urljoin(self.base, r.headers["location"])
            r = await b.get(consent)
            assert r.status_code == 303, "not signed in: to the sign-in page"
            login = urljoin(self.base, r.headers["location"])
            r = await b.get(login)
            assert r.status_code == 200, r.text
            r = await b.post(
                urljoin(self.base, "/admin/login"),
                data={
                    "csrf": _hidden(r.text, "csrf"),
                    "next": _hidden(r.text, "next"),
                    "username": self.username,
                    "password": PASSWORD,
                },
            )
            assert r.status_code == 303, r.text
            assert urljoin(self.base, r.headers["location"]) == consent, "back to the consent page"
            r = await b.get(consent)
            assert r.status_code == 200, r.text
            assert r.headers["x-frame-options"] == "DENY"
            self.consent_pages.append(r.text)
            page = r.text
            tools = re.findall(r'name="tool" value="([^"]+)"', page)
            r = await b.post(
                urljoin(self.base, "/admin/oauth/consent"),
                headers={"content-type": "application/x-www-form-urlencoded"},
                content=urlencode([
                    ("csrf", _hidden(page, "csrf")),
                    ("once", _hidden(page, "once")),
                    ("request", _hidden(page, "request")),
                    ("decision", "approve"),
                    ("library", self.library),
                    ("lifetime", "30"),
                    *[("tool", t) for t in tools],
                ]),
            )
            assert r.status_code == 303, r.text
            to = r.headers["location"]
            assert to.startswith(REDIRECT), to
            q = parse_qs(urlparse(to).query)
            self.result = AuthorizationCodeResult(code=q["code"][0], state=q["state"][0], iss=q["iss"][0])

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


class MetadataSite:
    """The client publisher's site: serves its Client ID Metadata Document at
    https://127.0.0.1:PORT/oauth/client.json and counts the fetches."""

    def __init__(self, stack: Stack) -> None:
        site = self
        self.hits = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path != "/oauth/client.json":
                    self.send_error(404)
                    return
                site.hits += 1
                body = json.dumps(site.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Cache-Control", "max-age=600")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(stack.tls_cert, stack.tls_key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"https://{self.host}/oauth/client.json"
        self.document = {
            "client_id": self.url,
            "client_name": "pytest CIMD client",
            "redirect_uris": [REDIRECT],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def __enter__(self) -> "MetadataSite":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _person(stack: Stack) -> str:
    """A console user who owns workspace A's library and manages workspace B's."""
    name = f"py-oauth-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [stack.binary, "user", "create", name, "--password-stdin"],
        input=PASSWORD + "\n",
        env=stack.cli_env,
        check=True,
        capture_output=True,
        text=True,
    )
    stack.cli("membership", "grant", name, stack.library_uid, "owner")
    stack.cli("membership", "grant", name, stack.other_library_uid, "manager")
    return name


async def test_the_sdk_connects_with_only_the_url_and_reads_exactly_the_library_granted(stack: Stack) -> None:
    person = Person(stack.base_url, _person(stack), stack.library_uid)
    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=stack.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="pytest OAuth client",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=person.approve,
        callback_handler=person.callback,
    )
    with anyio.fail_after(DEADLINE_S):
        async with httpx2.AsyncClient(auth=provider, trust_env=False, timeout=20.0) as http:
            async with Client(
                streamable_http_client(stack.mcp_url, http_client=http),
                mode="legacy",
                client_info=types.Implementation(name="mnemosyne-pytest-oauth", version="0"),
            ) as client:
                libs = await client.call_tool("list_libraries", {})
                assert [lib["uid"] for lib in libs.structured_content["libraries"]] == [stack.library_uid]
                found = await client.call_tool("search", {"query": stack.word, "limit": 10})
                assert {h["library_uid"] for h in found.structured_content["results"]} == {stack.library_uid}

            # Both libraries were offered, none checked; one was granted.
            page = person.consent_pages[0]
            for lib in (stack.library_uid, stack.other_library_uid):
                tag = re.search(rf'<input[^>]*name="library" value="{re.escape(lib)}"[^>]*>', page)
                assert tag and "checked" not in tag.group(0), lib
            assert storage.client_info is not None and storage.client_info.client_id.startswith("mcl_")
            first = storage.tokens
            assert first is not None and first.refresh_token and first.expires_in

            # Its token refreshes: the next request goes with a new one.
            provider.context.token_expiry_time = 1.0  # long past (0 would mean "no expiry")
            async with Client(
                streamable_http_client(stack.mcp_url, http_client=http),
                mode="legacy",
                client_info=types.Implementation(name="mnemosyne-pytest-oauth", version="0"),
            ) as client:
                libs = await client.call_tool("list_libraries", {})
                assert [lib["uid"] for lib in libs.structured_content["libraries"]] == [stack.library_uid]
            assert storage.tokens is not None and storage.tokens.access_token != first.access_token
            assert storage.tokens.refresh_token != first.refresh_token
            assert len(person.consent_pages) == 1, "refreshed, not authorized again"

    # A revoked grant answers 401 on the next request.
    grants = stack.cli("--json", "oauth", "grant", "list", "--user", person.username)
    grant_id = re.search(r'"id":\s*(\d+)', grants).group(1)
    stack.cli("oauth", "grant", "revoke", grant_id)
    await anyio.sleep(0.2)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    async with httpx2.AsyncClient(trust_env=False, timeout=10.0) as raw:
        r = await raw.post(
            stack.mcp_url,
            json=body,
            headers={
                "Authorization": f"Bearer {storage.tokens.access_token}",
                "Accept": "application/json, text/event-stream",
            },
        )
    assert r.status_code == 401, r.text
    assert r.json() == {"error": "invalid_token", "error_description": "Invalid MCP token."}


async def test_the_sdk_uses_a_client_metadata_document_instead_of_registering(stack: Stack) -> None:
    person = Person(stack.base_url, _person(stack), stack.library_uid)
    storage = MemoryStorage()
    with MetadataSite(stack) as site:
        provider = OAuthClientProvider(
            server_url=stack.mcp_url,
            client_metadata=OAuthClientMetadata(
                client_name="pytest CIMD client",
                redirect_uris=[REDIRECT],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="none",
            ),
            storage=storage,
            redirect_handler=person.approve,
            callback_handler=person.callback,
            client_metadata_url=site.url,
        )
        with anyio.fail_after(DEADLINE_S):
            async with httpx2.AsyncClient(auth=provider, trust_env=False, timeout=20.0) as http:
                async with Client(
                    streamable_http_client(stack.mcp_url, http_client=http),
                    mode="legacy",
                    client_info=types.Implementation(name="mnemosyne-pytest-cimd", version="0"),
                ) as client:
                    libs = await client.call_tool("list_libraries", {})
                    assert [lib["uid"] for lib in libs.structured_content["libraries"]] == [stack.library_uid]

        # No registration: the document's URL is the client_id.
        assert storage.client_info is not None and storage.client_info.client_id == site.url
        page = person.consent_pages[0]
        assert "pytest CIMD client" in page
        assert site.host in page, "the consent page names the document's host"
        assert site.hits == 1, "fetched once; the token exchange used the cache"
    clients = stack.cli("--json", "oauth", "client", "list")
    assert any(c["client_id"] == site.url and c["source"] == "cimd" for c in json.loads(clients)), clients
