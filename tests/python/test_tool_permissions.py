"""Tool permissions per credential (issue 24), through the official Python MCP SDK.

An opaque token or a team may carry an allowlist of tools (`mnemosyne token
create --tool …`, `token set-tools`, `team set-tools`; absent = every tool).
`tools/list` shows only the allowed tools, in both protocol eras; calling any
other tool, one that exists or not, is a JSON-RPC error naming it as not
available to this credential, counted as `refused`. A change made with the CLI
reaches the running server through Postgres NOTIFY: an open session sees it on
a later request without reconnecting.
"""

from __future__ import annotations

import json
import re
import uuid

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from conftest import Stack
from test_sdk_e2e import DEADLINE_S, STATELESS_VERSION, TOOLS, leaves, mcp_client

pytestmark = pytest.mark.anyio

#: JSON-RPC "Invalid params", what MCP answers for a tool a client may not call.
INVALID_PARAMS = -32602
#: How long a CLI change may take to reach the server's LISTEN connection
#: (polled, bounded; a change made through the server itself is fenced).
NOTIFY_BOUND_S = 10.0


def not_available(tool: str) -> str:
    return f"Tool {tool} is not available to this credential."


def mint(stack: Stack, *tools: str) -> tuple[int, str]:
    """A new opaque token of the stack's reader over workspace A's library."""
    args = ["--json", "token", "create", "--user", stack.reader, "--library", stack.library_uid, "--name", "perm"]
    for t in tools:
        args += ["--tool", t]
    out = json.loads(stack.cli(*args))
    assert out["tools"] == (list(tools) if tools else None), out
    return out["id"], out["token"]


def refused_count(stack: Stack, tool: str) -> float:
    text = httpx2.get(f"{stack.base_url}/metrics", trust_env=False, timeout=10.0).text
    m = re.search(r'^mcp_tool_calls_total\{outcome="refused",tool="' + tool + r'"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def names(client) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


async def refused(client, tool: str, args: dict) -> MCPError:
    with pytest.raises(Exception) as caught:
        await client.call_tool(tool, args)
    errors = leaves(caught.value)
    assert len(errors) == 1 and isinstance(errors[0], MCPError), errors
    return errors[0]


@pytest.mark.parametrize("mode", ["legacy", STATELESS_VERSION])
async def test_a_search_only_token_sees_and_calls_only_search(stack: Stack, mode: str) -> None:
    _, token = mint(stack, "search")
    before = refused_count(stack, "get_health")
    with anyio.fail_after(DEADLINE_S):
        async with mcp_client(stack, token, mode) as client:
            assert await names(client) == {"search"}
            hits = await client.call_tool("search", {"query": stack.word})
            assert hits.is_error is False
            assert {h["item_uid"] for h in hits.structured_content["results"]} == stack.item_uids

            e = await refused(client, "get_health", {})
            assert (e.error.code, e.error.message) == (INVALID_PARAMS, not_available("get_health"))
            # A tool that does not exist looks the same: no hint of what does.
            e = await refused(client, "drop_everything", {})
            assert (e.error.code, e.error.message) == (INVALID_PARAMS, not_available("drop_everything"))
            # The session (or the stateless client) still works afterwards.
            assert (await client.call_tool("search", {"query": stack.word})).is_error is False
    assert refused_count(stack, "get_health") == before + 1


async def test_a_token_with_no_tool_lists_nothing_and_calls_nothing(stack: Stack) -> None:
    token_id, token = mint(stack, "search")
    stack.cli("token", "set-tools", str(token_id), "--none")
    with anyio.fail_after(DEADLINE_S):
        async with mcp_client(stack, token, STATELESS_VERSION) as client:
            assert await names(client) == set()
            e = await refused(client, "search", {"query": stack.word})
            assert e.error.message == not_available("search")


async def test_a_token_allowlist_changed_with_the_cli_applies_to_an_open_session(stack: Stack) -> None:
    token_id, token = mint(stack)
    with anyio.fail_after(DEADLINE_S + 2 * NOTIFY_BOUND_S):
        async with mcp_client(stack, token, "legacy") as client:
            assert await names(client) == TOOLS

            stack.cli("token", "set-tools", str(token_id), "--tool", "get_health", "--tool", "list_libraries")
            with anyio.fail_after(NOTIFY_BOUND_S):
                while await names(client) != {"get_health", "list_libraries"}:
                    await anyio.sleep(0.05)
            e = await refused(client, "search", {"query": stack.word})
            assert e.error.message == not_available("search")
            assert (await client.call_tool("list_libraries", {})).is_error is False

            stack.cli("token", "set-tools", str(token_id), "--every")
            with anyio.fail_after(NOTIFY_BOUND_S):
                while await names(client) != TOOLS:
                    await anyio.sleep(0.05)
            assert (await client.call_tool("search", {"query": stack.word})).is_error is False

    listed = json.loads(stack.cli("--json", "token", "list", "--user", stack.reader))
    assert next(t for t in listed if t["id"] == token_id)["tools"] is None


@pytest.mark.parametrize("mode", ["legacy", STATELESS_VERSION])
async def test_a_team_allowlist_limits_its_jwt(stack: Stack, mode: str) -> None:
    # A team of this test's own: the stack's team is shared by other tests.
    team_id = str(uuid.uuid4())
    with httpx2.Client(base_url=stack.base_url, auth=(stack.service_user, stack.service_password),
                       trust_env=False, timeout=30.0) as http:
        r = http.post("/mcp_server/api/teams/", json={"id": team_id, "name": "perm team"})
        assert r.status_code == 201, r.text
        jwt = r.json()["jwt"]
        r = http.put(f"/mcp_server/api/teams/{team_id}/workspaces/", json={"workspace_ids": [stack.workspace]})
        assert r.status_code == 200, r.text
    out = json.loads(stack.cli("--json", "team", "set-tools", team_id, "--tool", "list_libraries"))
    assert out == {"id": team_id, "tools": ["list_libraries"]}

    with anyio.fail_after(DEADLINE_S + NOTIFY_BOUND_S):
        async with mcp_client(stack, jwt, mode) as client:
            with anyio.fail_after(NOTIFY_BOUND_S):
                while await names(client) != {"list_libraries"}:
                    await anyio.sleep(0.05)
            libs = await client.call_tool("list_libraries", {})
            assert [lib["uid"] for lib in libs.structured_content["libraries"]] == [stack.library_uid]
            e = await refused(client, "search", {"query": stack.word})
            assert (e.error.code, e.error.message) == (INVALID_PARAMS, not_available("search"))


def test_an_unknown_tool_is_refused_by_the_cli(stack: Stack) -> None:
    with pytest.raises(RuntimeError) as caught:
        stack.cli("token", "create", "--user", stack.reader, "--tool", "search", "--tool", "delete_all")
    assert 'unknown tool "delete_all"; the tools are: search, get_chunk' in str(caught.value)
