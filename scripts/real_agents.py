"""The check scripts/real-agents.sh runs: see there. Arguments: the install directory, the gateway."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import websockets

DIR, GATEWAY = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    ADDR = f"127.0.0.1:{s.getsockname()[1]}"
CONFIG = os.path.join(DIR, "gw.toml")
with open(CONFIG, "w") as f:
    f.write(f'data_dir = "{DIR}/data"\n[agents.codex]\ncommand = "{DIR}/node_modules/.bin/codex-acp"\n')
ENV = dict(os.environ, ACP_GATEWAY_JWT_SECRET="real-agents-secret-0123456789-0123456789", ACP_GATEWAY_LISTEN=ADDR,
           ACP_GATEWAY_AGENT=f"{DIR}/node_modules/.bin/claude-agent-acp", DATABASE_URL=f"sqlite://{DIR}/data/gw.db",
           RUST_LOG="warn")


def api(token, method, path, body=None):
    req = urllib.request.Request(f"http://{ADDR}{path}", method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def terminal(token):
    uri = f"ws://{ADDR}/api/agents/default/login/terminal?method=claude-login"
    async with websockets.connect(uri, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        seen, started, last = b"", time.time(), None
        while time.time() - started < 20:
            try:
                m = await asyncio.wait_for(ws.recv(), 3)
            except asyncio.TimeoutError:
                break
            if isinstance(m, bytes):
                seen += m
            else:
                last = m
                break
        text = seen.decode("utf-8", "replace")
        print(f"claude /login in the terminal: {len(seen)} bytes in {time.time() - started:.1f} s;",
              "'Welcome to Claude Code' shown" if "Welcome" in text else "no welcome", "; ended with", last)


def main():
    gw = subprocess.Popen([GATEWAY, "serve", "--config", CONFIG], env=ENV, stdout=subprocess.PIPE,
                          stderr=open(os.path.join(DIR, "gateway.log"), "w"))
    try:
        while "http://" not in (line := gw.stdout.readline().decode()):
            assert line, "the gateway exited before printing its address"
        token = subprocess.run([GATEWAY, "token", "--sub", "alice", "--config", CONFIG], env=ENV,
                               capture_output=True, text=True, check=True).stdout.strip()
        status, body = api(token, "GET", "/api/agents")
        for agent in json.loads(body)["agents"]:
            methods = [(m.get("id"), m.get("type", "agent")) for m in agent.get("authMethods") or []]
            print(f"{agent['name']}: {agent.get('agentInfo', {}).get('name')}, sign-in methods {methods}")
        print("codex key:", api(token, "PUT", "/api/agents/codex/keys",
                                {"methodId": "codex-api-key", "vars": {"CODEX_API_KEY": "sk-not-a-real-key"}}))
        asyncio.run(terminal(token))
        time.sleep(0.5)
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if b"--cli" in args and any(b"claude-agent-acp" in a for a in args):
                left.append(pid)
        print("login processes left after the socket closed:", left or "none")
    finally:
        gw.terminate()
        gw.wait(30)


main()
