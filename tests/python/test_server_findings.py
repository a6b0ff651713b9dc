"""Wire-level behaviour the end-to-end suite once found wrong (now fixed):
session ownership is indistinguishable from absence, DELETE of an unknown
session is 404, early refusals keep keep-alive connections sound, and
get_health refuses unknown arguments like every other tool.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest

from conftest import Stack
from test_sdk_e2e import DEADLINE_S, FRESH_CONNECTIONS, HANDSHAKE_VERSION, mcp_client

pytestmark = pytest.mark.anyio


def _headers(bearer: str, session: str | None = None) -> dict[str, str]:
    h = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {bearer}",
    }
    if session is not None:
        h |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": HANDSHAKE_VERSION}
    return h


async def _open_session(http: httpx2.AsyncClient, stack: Stack, bearer: str) -> str:
    r = await http.post(
        stack.mcp_url,
        headers=_headers(bearer),
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        },
    )
    assert r.status_code == 200, r.text
    return r.headers["mcp-session-id"]


async def test_get_health_refuses_unknown_arguments_like_the_other_tools(stack: Stack) -> None:
    with anyio.fail_after(DEADLINE_S):
        async with mcp_client(stack, stack.opaque_token, "legacy") as client:
            other = await client.call_tool("list_libraries", {"x": 1})
            assert other.is_error is True
            assert other.content[0].text == "Invalid argument `x`: unknown argument"
            health = await client.call_tool("get_health", {"x": 1})
    assert health.is_error is True
    assert health.content[0].text == "Invalid argument `x`: unknown argument"


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_another_principals_session_is_indistinguishable_from_an_unknown_one(stack: Stack, method: str) -> None:
    body = {"json": {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}} if method == "POST" else {}
    with anyio.fail_after(DEADLINE_S):
        async with httpx2.AsyncClient(timeout=10.0, trust_env=False, limits=FRESH_CONNECTIONS) as http:
            owned = await _open_session(http, stack, stack.opaque_token)
            # The team JWT is a valid credential, just not this session's owner.
            foreign = await http.request(method, stack.mcp_url, headers=_headers(stack.team_jwt, owned), **body)
            unknown = await http.request(
                method, stack.mcp_url, headers=_headers(stack.team_jwt, str(uuid.uuid4())), **body
            )
    assert foreign.status_code == 404
    assert (unknown.status_code, unknown.headers.get("content-type"), unknown.text) == (
        foreign.status_code,
        foreign.headers.get("content-type"),
        foreign.text,
    )


async def test_deleting_a_terminated_session_is_404(stack: Stack) -> None:
    with anyio.fail_after(DEADLINE_S):
        async with httpx2.AsyncClient(timeout=10.0, trust_env=False, limits=FRESH_CONNECTIONS) as http:
            sid = await _open_session(http, stack, stack.opaque_token)
            first = await http.delete(stack.mcp_url, headers=_headers(stack.opaque_token, sid))
            after = await http.post(
                stack.mcp_url,
                headers=_headers(stack.opaque_token, sid),
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            )
            again = await http.delete(stack.mcp_url, headers=_headers(stack.opaque_token, sid))
    assert first.status_code in (200, 202, 204)
    assert after.status_code == 404  # the session really is gone
    assert again.status_code == 404


def _read_response(sock: socket.socket) -> tuple[str, dict[str, str]]:
    """One HTTP/1.1 response with a Content-Length body: (status line, headers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed mid-response: {data!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(rest) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed mid-body")
        rest += chunk
    return lines[0], headers


def test_connection_refusing_an_unread_body_says_connection_close_or_stays_usable(stack: Stack) -> None:
    url = urlsplit(stack.mcp_url)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    head = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer mnm_wrong\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=5.0) as sock:
        # Headers first; the body follows only after the answer, as happens on
        # the wire whenever the refusal is faster than the client's second write.
        sock.sendall(head)
        status, headers = _read_response(sock)
        assert status == "HTTP/1.1 401 Unauthorized"
        if headers.get("connection", "").lower() == "close":
            return  # announced: a client will not reuse the connection
        time.sleep(0.2)  # let the server finish with the connection
        try:
            sock.sendall(body)
            sock.sendall(head + body)  # the next request on the kept-alive connection
            second, _ = _read_response(sock)
        except OSError as e:
            raise AssertionError(f"kept-alive connection was closed unannounced: {e!r}") from e
        assert second == "HTTP/1.1 401 Unauthorized"
