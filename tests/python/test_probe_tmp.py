import json, pytest, httpx2, anyio, collections
pytestmark = pytest.mark.anyio
S="2026-07-28"
LIST={"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":S,"io.modelcontextprotocol/clientCapabilities":{}}}}
@pytest.mark.parametrize("case", ["mcp-good-200", "mcp-bad-401", "rest-bad-basic-401", "mcp-bad-401-get", "mcp-bad-401-content-header"])
async def test_probe(stack, case):
    c = collections.Counter()
    async with httpx2.AsyncClient(timeout=10, trust_env=False) as h:
        for i in range(400):
            hd = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", "MCP-Protocol-Version": S, "Mcp-Method": "tools/list"}
            try:
                if case == "mcp-good-200":
                    hd["Authorization"] = f"Bearer {stack.opaque_token}"
                    r = await h.post(stack.mcp_url, headers=hd, json=LIST)
                elif case == "mcp-bad-401":
                    hd["Authorization"] = "Bearer nope"
                    r = await h.post(stack.mcp_url, headers=hd, json=LIST)
                elif case == "mcp-bad-401-content-header":
                    hd["Authorization"] = "Bearer nope"
                    r = await h.post(stack.mcp_url, headers=hd, content=json.dumps(LIST).encode())
                elif case == "mcp-bad-401-get":
                    hd["Authorization"] = "Bearer nope"
                    r = await h.get(stack.mcp_url, headers=hd)
                else:
                    r = await h.post(stack.base_url + "/library/api/ingest/", auth=("nobody", "wrongwrong"), json={"workspace_id": "x", "item": {"title": "t"}, "content": "c"})
                c[r.status_code]+=1
            except httpx2.HTTPError as e:
                c[type(e).__name__]+=1
    print("\nRESULT", case, dict(c))
