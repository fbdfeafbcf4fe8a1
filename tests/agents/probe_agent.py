#!/usr/bin/env python3
"""A probe agent for the tenancy tests: a small ACP v1 stdio agent (standard library only) that
records what a user's agent process can see and reach, and behaves like real coding agents in
the ways that matter for tenancy.

It writes, under its own ``$HOME``:
  * ``probe-start.json``: its environment, ``HOME``, cwd, pid, and for every path in
    ``PROBE_PATHS`` (colon-separated) whether it could read it and how many bytes (``sizes``,
    -1 when it could not); with ``PROBE_TIOCSTI`` set, what became of pushing
    ``echo INJECTED-BY-AGENT`` into its controlling terminal with ``TIOCSTI`` (``tiocsti``);
  * ``probe-stdin.jsonl``: every line the gateway sent it, verbatim.

Like real agents it starts every ``stdio`` MCP server it is given in ``session/new`` (a command
run on this host), and answers ``authenticate``. With ``PROBE_FIXED_SESSION_ID`` set it gives
every session that id (as an agent that lets a client choose it would).

Capabilities: ``loadSession``, ``sessionCapabilities.resume``, ``mcpCapabilities.http``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

HOME = os.environ.get("HOME", "/nonexistent")


def readable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def size(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return len(f.read(1 << 16))
    except OSError:
        return -1


def push_keystrokes() -> str:
    """What the security review's agent did: type a command into the terminal it runs under."""
    import fcntl
    import termios

    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        return f"no terminal: {e}"
    try:
        for byte in b"echo INJECTED-BY-AGENT\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
        return "injected"
    except OSError as e:
        return f"refused: {e}"
    finally:
        os.close(fd)


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def start_mcp_servers(servers: list) -> None:
    for server in servers or []:
        if server.get("type", "stdio") != "stdio":
            continue
        env = {e["name"]: e["value"] for e in server.get("env", [])}
        subprocess.Popen(
            [server["command"], *server.get("args", [])],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def main() -> None:
    paths = [p for p in os.environ.get("PROBE_PATHS", "").split(":") if p]
    with open(os.path.join(HOME, "probe-start.json"), "w") as f:
        json.dump(
            {
                "env": dict(os.environ),
                "home": HOME,
                "cwd": os.getcwd(),
                "pid": os.getpid(),
                "readable": {p: readable(p) for p in paths},
                "sizes": {p: size(p) for p in paths},
                "tiocsti": push_keystrokes() if os.environ.get("PROBE_TIOCSTI") else None,
            },
            f,
        )
    log = open(os.path.join(HOME, "probe-stdin.jsonl"), "a")
    for line in sys.stdin:
        log.write(line)
        log.flush()
        msg = json.loads(line)
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if mid is None or method is None:
            continue
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": True,
                    "mcpCapabilities": {"http": True, "sse": False},
                    "sessionCapabilities": {"resume": {}},
                },
                "authMethods": [{"id": "probe-login", "name": "Probe login"}],
                "agentInfo": {"name": "probe-agent", "version": "1"},
            }
        elif method == "session/new":
            start_mcp_servers(params.get("mcpServers"))
            sid = os.environ.get("PROBE_FIXED_SESSION_ID") or f"probe-{uuid.uuid4().hex}"
            result = {"sessionId": sid}
        elif method in ("session/load", "session/resume"):
            result = {}
        elif method == "session/prompt":
            text = " ".join(b.get("text", "") for b in params.get("prompt", []))
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": params.get("sessionId"),
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": f"probe: {text}"},
                        },
                    },
                }
            )
            result = {"stopReason": "end_turn"}
        elif method == "authenticate":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
