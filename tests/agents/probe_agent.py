#!/usr/bin/env python3
"""A probe agent for the tenancy tests: a small ACP v1 stdio agent (standard library only) that
records what a user's agent process can see and reach, and behaves like real coding agents in
the ways that matter for tenancy.

It writes, under its own ``$HOME``:
  * ``probe-start.json``: its environment, ``HOME``, cwd, pid, and for every path in
    ``PROBE_PATHS`` (colon-separated) whether it could read it and how many bytes (``sizes``,
    -1 when it could not); with ``PROBE_TIOCSTI`` set, what became of pushing
    ``echo INJECTED-BY-AGENT`` into its controlling terminal with ``TIOCSTI`` (``tiocsti``);
    for every ``host:port`` in ``PROBE_CONNECT`` (comma-separated; ``@NAME``: read from the
    file NAME in its home), what became of a TCP
    connection to it (``connect``: ``"connected"`` or ``"error: ..."``); an entry written
    ``?host:port`` is tried only when a reject route covers it (else ``"skipped: ..."``), so a
    test host never sends a packet to an address such as the cloud metadata endpoint; and its
    IPv4 routing table (``routes``, from ``/proc/net/route``);
  * ``probe-stdin.jsonl``: every line the gateway sent it, verbatim.

Like real agents it starts every ``stdio`` MCP server it is given in ``session/new`` (a command
run on this host), and answers ``authenticate``. With ``PROBE_FIXED_SESSION_ID`` set it gives
every session that id (as an agent that lets a client choose it would).

Capabilities: ``loadSession``, ``sessionCapabilities.resume``, ``mcpCapabilities.http``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
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


def routes() -> list:
    """The IPv4 routes this process sees (its network namespace's), as dicts."""
    out = []
    try:
        with open("/proc/net/route") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        cols = line.split()
        if len(cols) < 8:
            continue
        to_ip = lambda h: socket.inet_ntoa(struct.pack("<I", int(h, 16)))
        flags = int(cols[3], 16)
        out.append(
            {
                "iface": cols[0],
                "destination": to_ip(cols[1]),
                "gateway": to_ip(cols[2]),
                "mask": to_ip(cols[7]),
                "reject": bool(flags & 0x0200),
            }
        )
    return out


def rejected(host: str, table: list) -> bool:
    """Whether the longest route matching ``host`` in ``table`` is a reject route."""
    try:
        ip = struct.unpack("!I", socket.inet_aton(host))[0]
    except OSError:
        return False
    best = None
    for r in table:
        net = struct.unpack("!I", socket.inet_aton(r["destination"]))[0]
        mask = struct.unpack("!I", socket.inet_aton(r["mask"]))[0]
        if ip & mask == net & mask and (best is None or mask > best[0]):
            best = (mask, r["reject"])
    return bool(best and best[1])


def try_connect(target: str, table: list) -> str:
    guarded = target.startswith("?")
    host, _, port = target.lstrip("?").rpartition(":")
    if guarded and not rejected(host, table):
        return "skipped: no reject route covers it"
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return "connected"
    except OSError as e:
        return f"error: {e.__class__.__name__}: {e}"


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
    connect = os.environ.get("PROBE_CONNECT", "")
    if connect.startswith("@"):
        # A file in its home: for targets known only once the gateway listens (its own port).
        try:
            with open(os.path.join(HOME, connect[1:])) as f:
                connect = f.read().strip()
        except OSError:
            connect = ""
    targets = [t for t in connect.split(",") if t]
    table = routes()
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
                "connect": {t: try_connect(t, table) for t in targets},
                "routes": table,
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
