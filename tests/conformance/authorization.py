"""The conformance suite's authorization-server scenarios against a running
Mnemosyne (issue 48): `authorization-server-metadata-endpoint`, and
`authorization-code-grant`, whose person is played here as in
tests/python/test_oauth.py: it signs in on the console and approves one
library on the consent page when the suite prints the authorization URL.

    authorization.py NODE CLI ISSUER USERNAME PASSWORD LIBRARY OUTDIR

Exit 0 when both scenarios pass. Bounded: 60 s per scenario.
"""

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import httpx2 as httpx

node, cli, issuer, username, password, library, out = sys.argv[1:8]


def hidden(html: str, name: str) -> str:
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    if not m:
        raise SystemExit(f"no {name} field on the page")
    return m.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def approve(url: str) -> None:
    """Signs in and approves `library` on the consent page; follows the
    redirect to the suite's callback."""
    with httpx.Client(follow_redirects=False, trust_env=False, timeout=20.0) as b:
        r = b.get(url)
        assert r.status_code == 303, (r.status_code, r.text[:300])
        consent = urllib.parse.urljoin(issuer, r.headers["location"])
        r = b.get(consent)
        login = urllib.parse.urljoin(issuer, r.headers["location"])
        page = b.get(login).text
        r = b.post(
            urllib.parse.urljoin(issuer, "/admin/login"),
            data={"csrf": hidden(page, "csrf"), "next": hidden(page, "next"),
                  "username": username, "password": password},
        )
        assert r.status_code == 303, (r.status_code, r.text[:300])
        page = b.get(consent).text
        tools = re.findall(r'name="tool" value="([^"]+)"', page)
        r = b.post(
            urllib.parse.urljoin(issuer, "/admin/oauth/consent"),
            headers={"content-type": "application/x-www-form-urlencoded"},
            content=urllib.parse.urlencode([
                ("csrf", hidden(page, "csrf")), ("once", hidden(page, "once")),
                ("request", hidden(page, "request")), ("decision", "approve"),
                ("library", library), ("lifetime", "1"), *[("tool", t) for t in tools],
            ]),
        )
        assert r.status_code == 303, (r.status_code, r.text[:300])
        httpx.get(r.headers["location"], trust_env=False, timeout=20.0)


def run(scenario: str, extra: list[str]) -> bool:
    """Every authorization-server scenario (the code grant reads the
    metadata scenario's result, so they run in one invocation)."""
    cmd = [node, cli, "authorization", "--url", issuer, "-o", out, *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    timer = threading.Timer(60, p.kill)
    timer.start()
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith(issuer) and "/oauth/authorize?" in line:
                threading.Thread(target=approve, args=(line.strip(),), daemon=True).start()
        p.wait()
    finally:
        timer.cancel()
    text = "".join(lines)
    m = re.search(r"Total: (\d+) passed, (\d+) failed", text)
    # Two scenarios, each at least one check (the metadata scenario checks
    # `client_id_metadata_document_supported` too now that it is true: 3).
    ok = p.returncode == 0 and m is not None and m.group(2) == "0" and int(m.group(1)) >= 2
    print(f"[conformance] authorization {scenario}: {'ok' if ok else 'FAILED'}"
          f" ({m.group(0) if m else 'no result'})", file=sys.stderr)
    if not ok:
        print(text[-3000:], file=sys.stderr)
    return ok


port = free_port()
r = httpx.post(f"{issuer}/oauth/register", trust_env=False, json={
    "client_name": "MCP conformance suite",
    "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
    "grant_types": ["authorization_code", "refresh_token"],
    "response_types": ["code"],
    "token_endpoint_auth_method": "none",
})
assert r.status_code == 201, r.text
client_id = r.json()["client_id"]
resource = json.loads(httpx.get(f"{issuer}/.well-known/oauth-protected-resource", trust_env=False).text)["resource"]
ok = run("all", ["--client-id", client_id, "--resource", resource, "--port", str(port)])
sys.exit(0 if ok else 1)
