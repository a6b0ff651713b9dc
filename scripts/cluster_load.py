#!/usr/bin/env python3
"""Steady load through a balancer while something happens to the replicas
(issue 31): counts every request that failed at the client.

usage: scripts/cluster_load.py BASE_URL --basic USER:PASSWORD [--rate 100] [--seconds 60]
                               [--workers 16] [--during 'scripts/cluster roll']

Ingests a document into a new workspace, then runs --workers threads, each
with a team of its own (team REST) reading that workspace, its own keep-alive
connection and its own legacy MCP session (2025-11-25), paced to --rate requests a second in all:
search and tools/list on the session, stateless 2026-07-28 search, a team
REST read, and an ingest every 20th request. With --during, that command runs
once the load is steady; the load stops --seconds after it started (or when
the command ends, whichever is later, plus 3 s). Standard library only.
"""

import argparse
import base64
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

STATELESS = "2026-07-28"


class Conn:
    """One keep-alive HTTP/1.1 connection, reopened when the server closes it
    (a draining replica answers with Connection: close)."""

    def __init__(self, base):
        u = urllib.parse.urlsplit(base)
        self.host, self.port = u.hostname, u.port or 80
        self.c = None

    def request(self, method, path, body=None, headers=None):
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        try:
            self.c.request(method, path, body=data, headers=h)
            r = self.c.getresponse()
            raw = r.read()
            if (r.getheader("Connection") or "").lower() == "close":
                self.c.close()
                self.c = None
            return r.status, r.getheader("Content-Type") or "", raw, r.getheader("Mcp-Session-Id")
        except Exception:
            self.c.close()
            self.c = None
            raise


def rpc_result(ctype, raw):
    """The JSON-RPC response in a JSON or SSE answer."""
    if ctype.startswith("text/event-stream"):
        for line in raw.decode().splitlines():
            if line.startswith("data:"):
                try:
                    m = json.loads(line[5:])
                except ValueError:
                    continue
                if "id" in m and ("result" in m or "error" in m):
                    return m
        return None
    return json.loads(raw) if raw else None


class Worker:
    def __init__(self, base, jwt, basic, team, ws, stats):
        self.conn = Conn(base)
        self.jwt, self.basic, self.team, self.ws, self.stats = jwt, basic, team, ws, stats
        self.sid = None
        self.n = 0

    def mcp(self, body, stateless=False):
        h = {"Authorization": f"Bearer {self.jwt}", "Accept": "application/json, text/event-stream"}
        if stateless:
            h["MCP-Protocol-Version"] = STATELESS
            h["Mcp-Method"] = body["method"]
            if body["method"] == "tools/call":
                h["Mcp-Name"] = body["params"]["name"]
            meta = body.setdefault("params", {}).setdefault("_meta", {})
            meta["io.modelcontextprotocol/protocolVersion"] = STATELESS
            meta["io.modelcontextprotocol/clientCapabilities"] = {}
        elif self.sid:
            h["Mcp-Session-Id"] = self.sid
            h["MCP-Protocol-Version"] = "2025-11-25"
        return self.conn.request("POST", "/mcp/", body, h)

    def open_session(self):
        st, ct, raw, sid = self.mcp({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "load", "version": "0"}}})
        if st != 200 or not sid:
            raise RuntimeError(f"initialize: {st} {raw[:200]!r}")
        self.sid = sid
        st, _, raw, _ = self.mcp({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if st not in (200, 202):
            raise RuntimeError(f"initialized: {st} {raw[:200]!r}")

    def one(self):
        self.n += 1
        k = self.n % 20
        if k == 0:
            st, _, raw, _ = self.conn.request(
                "POST", "/library/api/ingest/",
                {"workspace_id": self.ws, "item": {"title": f"load {uuid.uuid4()}"},
                 "content": "# Load\n\nA document written while the replicas restart."},
                {"Authorization": f"Basic {self.basic}"})
            return "ingest", st in (200, 201), st, raw
        if k in (5, 15):
            st, _, raw, _ = self.conn.request(
                "GET", f"/mcp_server/api/teams/{self.team}/", None, {"Authorization": f"Basic {self.basic}"})
            return "rest", st == 200, st, raw
        stateless = k % 4 == 3
        body = ({"jsonrpc": "2.0", "id": self.n, "method": "tools/list", "params": {}} if k % 2 == 0 else
                {"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                 "params": {"name": "search", "arguments": {"query": "pelican"}}})
        st, ct, raw, _ = self.mcp(body, stateless)
        m = rpc_result(ct, raw) if st == 200 else None
        ok = st == 200 and m is not None and "result" in m and not m["result"].get("isError", False)
        return ("stateless" if stateless else "session"), ok, st, raw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--basic", required=True, help="USER:PASSWORD of the service account")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--during", default=None, help="command to run once the load is steady")
    a = ap.parse_args()
    basic = base64.b64encode(a.basic.encode()).decode()
    setup = Conn(a.base)
    ws = f"load_{uuid.uuid4().hex[:8]}"
    st, _, raw, _ = setup.request("POST", "/library/api/ingest/",
                                  {"workspace_id": ws, "item": {"title": "Pelicans"},
                                   "content": "# Pelicans\n\nThe pelican migrates along the coast."},
                                  {"Authorization": f"Basic {basic}"})
    assert st in (200, 201), (st, raw)

    def new_team():
        """A team of its own per worker (as many clients, each its own credential)."""
        team = str(uuid.uuid4())
        st, _, raw, _ = setup.request("POST", "/mcp_server/api/teams/", {"id": team, "name": "load"},
                                      {"Authorization": f"Basic {basic}"})
        # 202: committed, but a replica that just left did not confirm (see docs/operations.md).
        assert st in (201, 202), (st, raw)
        jwt = json.loads(raw)["jwt"]
        st, _, raw, _ = setup.request("PUT", f"/mcp_server/api/teams/{team}/workspaces/",
                                      {"workspace_ids": [ws]}, {"Authorization": f"Basic {basic}"})
        assert st in (200, 202), (st, raw)
        return team, jwt

    lock = threading.Lock()
    stats = {"sent": 0, "failed": 0, "by_kind": {}, "failures": []}
    workers = [Worker(a.base, jwt, basic, team, ws, stats) for team, jwt in (new_team() for _ in range(a.workers))]
    for w in workers:
        w.open_session()
    stop = threading.Event()
    interval = a.workers / a.rate

    def run(w, offset):
        next_at = time.monotonic() + offset
        while not stop.is_set():
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval
            try:
                kind, ok, st, raw = w.one()
                detail = f"{kind} {st} {raw[:160]!r}"
            except Exception as e:  # a connection error is a failed request
                kind, ok, detail = "error", False, f"{type(e).__name__}: {e}"
            with lock:
                stats["sent"] += 1
                k = stats["by_kind"].setdefault(kind, [0, 0])
                k[0] += 1
                if not ok:
                    k[1] += 1
                    stats["failed"] += 1
                    if len(stats["failures"]) < 20:
                        stats["failures"].append(f"{time.strftime('%H:%M:%S')} {detail}")

    threads = [threading.Thread(target=run, args=(w, i * interval / a.workers), daemon=True)
               for i, w in enumerate(workers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    during_rc = None
    if a.during:
        time.sleep(3)
        during_rc = subprocess.call(a.during, shell=True)
        time.sleep(3)
    left = a.seconds - (time.monotonic() - started)
    if left > 0:
        time.sleep(left)
    stop.set()
    for t in threads:
        t.join(timeout=35)
    elapsed = time.monotonic() - started
    print(json.dumps({
        "requests": stats["sent"], "failed": stats["failed"], "seconds": round(elapsed, 1),
        "rate": round(stats["sent"] / elapsed, 1), "by_kind": stats["by_kind"],
        "during_rc": during_rc, "failures": stats["failures"]}, indent=1))
    return 1 if stats["failed"] or (during_rc not in (None, 0)) else 0


if __name__ == "__main__":
    sys.exit(main())
