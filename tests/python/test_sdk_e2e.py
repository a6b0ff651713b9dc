"""The MCP endpoint through the official Python MCP SDK (`mcp==2.3.0`).

Both protocol eras the server speaks on one endpoint:

* session mode: `Client(..., mode="legacy")` does the `initialize` handshake
  (2025-11-25) and keeps an `Mcp-Session-Id`;
* stateless 2026-07-28: `Client(..., mode="2026-07-28")` adopts the revision
  without a handshake, and `mode="auto"` gets there through `server/discover`;
  every request then carries `MCP-Protocol-Version`, `Mcp-Method` (and
  `Mcp-Name`) and the `io.modelcontextprotocol/*` `_meta` envelope.

Each test opens its own client over the session's server (conftest.py), so the
tests do not depend on each other or on their order. A wire recorder on the
SDK's HTTP client checks that the SDK really spoke the era under test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import Stack

pytestmark = pytest.mark.anyio

#: Wall-clock bound on one test's MCP traffic.
DEADLINE_S = 30.0
#: Bound on one MCP request round trip inside the SDK.
READ_TIMEOUT_S = 15.0

HANDSHAKE_VERSION = "2025-11-25"
STATELESS_VERSION = "2026-07-28"
TOOLS = {"search", "get_chunk", "list_libraries", "list_collections", "list_items", "get_health"}
EMPTY_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
PROGRESS = [
    (0.0, None, "mnemosyne/search: started"),
    (1.0, 1.0, "mnemosyne/search: completed"),
]
INVALID_TOKEN_BODY = {"error": "invalid_token", "error_description": "Invalid MCP token."}
INVALID_TOKEN_CHALLENGE = 'Bearer error="invalid_token", error_description="Invalid MCP token."'


def _metadata_url(stack: "Stack") -> str:
    """The RFC 9728 metadata URL every 401 on /mcp names (issue 48)."""
    return f"{stack.base_url}/.well-known/oauth-protected-resource"


# --------------------------------------------------------------------------- helpers


@dataclass
class Exchange:
    method: str
    request_headers: dict[str, str]
    body: Any
    status: int
    response_headers: dict[str, str]

    @property
    def rpc_method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None


@dataclass
class Wire:
    """Every HTTP exchange the SDK's client made (request side and status)."""

    exchanges: list[Exchange] = field(default_factory=list)

    def hooks(self) -> dict[str, list[Any]]:
        async def on_response(response: httpx2.Response) -> None:
            req = response.request
            raw = req.content
            self.exchanges.append(
                Exchange(
                    method=req.method,
                    request_headers={k.lower(): v for k, v in req.headers.items()},
                    body=json.loads(raw) if raw else None,
                    status=response.status_code,
                    response_headers={k.lower(): v for k, v in response.headers.items()},
                )
            )

        return {"response": [on_response]}

    def posts(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST"]


#: No connection reuse. Used wherever the server refuses a request with a body
#: before reading it: it then closes the connection without `Connection: close`
#: (see test_server_findings.py), and a client that reuses it may get
#: "Server disconnected" instead of the next answer.
FRESH_CONNECTIONS = httpx2.Limits(max_keepalive_connections=0)


@asynccontextmanager
async def mcp_client(
    stack: Stack, bearer: str, mode: str, wire: Wire | None = None, *, reuse_connections: bool = True
) -> AsyncIterator[Client]:
    """An SDK client over Streamable HTTP with `Authorization: Bearer <bearer>`."""
    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {bearer}"},
        timeout=httpx2.Timeout(10.0, read=READ_TIMEOUT_S),
        trust_env=False,
        event_hooks=wire.hooks() if wire is not None else None,
        **({} if reuse_connections else {"limits": FRESH_CONNECTIONS}),
    ) as http:
        transport = streamable_http_client(stack.mcp_url, http_client=http)
        async with Client(
            transport,
            mode=mode,
            read_timeout_seconds=READ_TIMEOUT_S,
            client_info=types.Implementation(name="mnemosyne-pytest", version="0"),
        ) as client:
            yield client


def bearer_of(stack: Stack, principal: str) -> str:
    return {"opaque": stack.opaque_token, "team": stack.team_jwt}[principal]


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


async def exercise(client: Client, stack: Stack) -> None:
    """What every principal in every era must see: the six tools, a scoped
    search with progress, exactly its library, and a healthy server."""
    # tools/list
    listed = await client.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == TOOLS
    assert tools["get_health"].input_schema == EMPTY_SCHEMA
    assert tools["get_health"].input_schema["additionalProperties"] is False
    for t in tools.values():
        assert t.input_schema["type"] == "object", t.name
        assert t.input_schema["additionalProperties"] is False, t.name
        assert t.annotations is not None and t.annotations.read_only_hint is True, t.name
    assert tools["search"].input_schema["required"] == ["query"]

    # tools/call search, with a progress callback
    progress: list[tuple[float, float | None, str | None]] = []
    two_seen = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))
        if len(progress) >= 2:
            two_seen.set()

    result = await client.call_tool("search", {"query": stack.word, "limit": 10}, progress_callback=on_progress)
    # The SDK runs progress callbacks as tasks of their own: let them land.
    with anyio.fail_after(5):
        await two_seen.wait()
    assert progress == PROGRESS
    assert result.is_error is False
    hits = result.structured_content["results"]
    # Workspace B holds the word too; only workspace A's library may answer.
    assert {h["library_uid"] for h in hits} == {stack.library_uid}
    assert {h["item_uid"] for h in hits} == stack.item_uids
    assert sorted(h["item_title"] for h in hits) == sorted(d.title for d in stack.documents)
    assert len(hits) == len(stack.documents)
    for h in hits:
        assert stack.word in h["text"], h
        assert h["ordinal"] == 0, h
        assert h["chunk_uid"] and h["collection_uid"], h
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert [c.type for c in result.content] == ["text"]
    assert result.content[0].text.startswith(f'{len(hits)} result(s) for "{stack.word}"')

    # Asking for the other library narrows to nothing, never widens.
    narrowed = await client.call_tool("search", {"query": stack.word, "library_uids": [stack.other_library_uid]})
    assert narrowed.is_error is False
    assert narrowed.structured_content == {"results": []}

    libraries = await client.call_tool("list_libraries", {})
    assert libraries.is_error is False
    assert [lib["uid"] for lib in libraries.structured_content["libraries"]] == [stack.library_uid]

    # get_health: one text block holding JSON
    health = await client.call_tool("get_health", {})
    assert health.is_error is False
    assert [c.type for c in health.content] == ["text"]
    body = json.loads(health.content[0].text)
    assert body["status"] == "ok", body
    assert set(body) == {"status", "timestamp", "search"}, body
    assert "keyword" in body["search"]["modes"], body


# --------------------------------------------------------------------------- session mode


@pytest.mark.parametrize("principal", ["opaque", "team"])
async def test_session_mode(stack: Stack, principal: str) -> None:
    wire = Wire()
    with anyio.fail_after(DEADLINE_S):
        async with mcp_client(stack, bearer_of(stack, principal), "legacy", wire) as client:
            assert client.protocol_version == HANDSHAKE_VERSION
            assert client.server_info is not None and client.server_info.name == "mnemosyne"
            assert client.server_capabilities.tools is not None
            await exercise(client, stack)

    posts = wire.posts()
    assert posts[0].rpc_method == "initialize"
    assert posts[0].body["params"]["protocolVersion"] == HANDSHAKE_VERSION
    assert "mcp-session-id" not in posts[0].request_headers
    session = posts[0].response_headers["mcp-session-id"]
    assert session
    assert posts[1].rpc_method == "notifications/initialized"
    for e in wire.exchanges[1:]:
        assert e.request_headers.get("mcp-session-id") == session, (e.method, e.rpc_method)
        assert e.request_headers.get("mcp-protocol-version") == HANDSHAKE_VERSION, (e.method, e.rpc_method)
    assert all(e.status < 300 for e in wire.exchanges), [(e.method, e.rpc_method, e.status) for e in wire.exchanges]
    # Leaving the client ends the session.
    assert wire.exchanges[-1].method == "DELETE"


# --------------------------------------------------------------------------- stateless 2026-07-28


@pytest.mark.parametrize("mode", [STATELESS_VERSION, "auto"], ids=["pinned", "discover"])
@pytest.mark.parametrize("principal", ["opaque", "team"])
async def test_stateless_mode(stack: Stack, principal: str, mode: str) -> None:
    wire = Wire()
    with anyio.fail_after(DEADLINE_S):
        async with mcp_client(stack, bearer_of(stack, principal), mode, wire) as client:
            assert client.protocol_version == STATELESS_VERSION
            if mode == "auto":
                # Learnt from server/discover, not synthesized by the SDK.
                assert client.server_info is not None and client.server_info.name == "mnemosyne"
                assert client.server_capabilities.tools is not None
            await exercise(client, stack)

    methods = [e.rpc_method for e in wire.exchanges]
    assert "initialize" not in methods and "notifications/initialized" not in methods
    if mode == "auto":
        assert methods[0] == "server/discover"
    assert all(e.method == "POST" for e in wire.exchanges), [e.method for e in wire.exchanges]
    for e in wire.exchanges:
        h, params = e.request_headers, e.body.get("params", {})
        assert e.status == 200, (e.rpc_method, e.status)
        assert h["mcp-protocol-version"] == STATELESS_VERSION
        assert h["mcp-method"] == e.rpc_method
        if e.rpc_method == "tools/call":
            assert h["mcp-name"] == params["name"]
        assert "mcp-session-id" not in h and "mcp-session-id" not in e.response_headers
        meta = params["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == STATELESS_VERSION
        assert "io.modelcontextprotocol/clientCapabilities" in meta
    search = [e for e in wire.exchanges if e.rpc_method == "tools/call" and e.body["params"]["name"] == "search"]
    assert "progressToken" in search[0].body["params"]["_meta"]


# --------------------------------------------------------------------------- refused bearers


def _tampered(jwt: str) -> str:
    """The team JWT with a signature that is well-formed but wrong."""
    head, payload, _ = jwt.split(".")
    return f"{head}.{payload}.{base64.urlsafe_b64encode(bytes(32)).rstrip(b'=').decode()}"


WRONG_BEARERS = {
    "unknown-opaque": lambda s: "mnm_" + "A" * 43,
    "tampered-team-jwt": lambda s: _tampered(s.team_jwt),
}


@pytest.mark.parametrize("mode", ["legacy", STATELESS_VERSION, "auto"])
@pytest.mark.parametrize("wrong", list(WRONG_BEARERS))
async def test_wrong_bearer_fails_fast_through_the_sdk(stack: Stack, wrong: str, mode: str) -> None:
    wire = Wire()
    started = anyio.current_time()
    with anyio.fail_after(DEADLINE_S):
        with pytest.raises(Exception) as caught:
            # mode="auto" sends server/discover, then initialize after the 401.
            async with mcp_client(stack, WRONG_BEARERS[wrong](stack), mode, wire, reuse_connections=False) as client:
                await client.list_tools()
    assert anyio.current_time() - started < 5.0, "a refused bearer must fail fast, not hang"
    errors = leaves(caught.value)
    assert len(errors) == 1 and isinstance(errors[0], MCPError), errors
    # How SDK 2.3.0 reports a non-JSON-RPC HTTP error (streamable_http.py).
    assert errors[0].error.code == types.INTERNAL_ERROR
    assert errors[0].error.message == "Server returned an error response"
    # Every request the SDK made was refused with 401, none reached MCP.
    assert wire.exchanges, "the SDK sent nothing"
    assert {e.status for e in wire.exchanges} == {401}
    first = {"legacy": "initialize", STATELESS_VERSION: "tools/list", "auto": "server/discover"}[mode]
    assert wire.exchanges[0].rpc_method == first


def _raw_headers(bearer: str | None, stateless: bool, method: str) -> dict[str, str]:
    h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if bearer is not None:
        h["Authorization"] = f"Bearer {bearer}"
    if stateless:
        h |= {"MCP-Protocol-Version": STATELESS_VERSION, "Mcp-Method": method}
    return h


def _raw_body(stateless: bool) -> dict[str, Any]:
    if stateless:
        return {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }


@pytest.mark.parametrize("stateless", [False, True], ids=["initialize", "stateless"])
@pytest.mark.parametrize("wrong", [*WRONG_BEARERS, "missing"])
async def test_refused_bearer_is_a_401_on_the_wire(stack: Stack, wrong: str, stateless: bool) -> None:
    bearer = None if wrong == "missing" else WRONG_BEARERS[wrong](stack)
    body = _raw_body(stateless)
    with anyio.fail_after(DEADLINE_S):
        async with httpx2.AsyncClient(timeout=10.0, trust_env=False, limits=FRESH_CONNECTIONS) as http:
            r = await http.post(stack.mcp_url, headers=_raw_headers(bearer, stateless, body["method"]), json=body)
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in r.headers
    if wrong == "missing":
        assert r.json() == {"error": "invalid_request", "error_description": "Missing bearer token."}
        # The embedded authorization server (issue 48) says where its metadata is.
        assert r.headers["www-authenticate"] == f'Bearer resource_metadata="{_metadata_url(stack)}", scope="mcp"'
    else:
        assert r.json() == INVALID_TOKEN_BODY
        assert r.headers["www-authenticate"] == f'{INVALID_TOKEN_CHALLENGE}, resource_metadata="{_metadata_url(stack)}", scope="mcp"'
