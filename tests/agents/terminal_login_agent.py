#!/usr/bin/env python3
"""A tiny ACP v1 stdio agent (standard library only) whose ``initialize`` lists sign-in methods,
and the login programs its ``terminal`` methods run, for tests/signin_terminal.rs.

Run without arguments it is the agent. Its methods (``MARKER`` from its environment is put on
every login program's command line, so a test can find the processes):
  * ``login``: ``terminal``, ``_meta.terminal-auth`` naming this file in ``login`` mode (or the
    mode ``$HOME/login-mode`` names: what one user makes their own agent say);
  * ``plain``: ``terminal`` without ``_meta``: the agent's own command line plus ``login MARKER``,
    with ``env`` ``LOGIN_FLAVOUR=plain-env``;
  * ``sleep``, ``flood``: ``terminal``, this file in that mode;
  * ``agent-login``: of type ``agent`` (not a terminal).

``session/prompt`` answers ``-32000`` (authentication required) until ``$HOME/.login-ok`` exists,
then streams ``signed in as CODE`` and ends its turn. It advertises the draft ``auth/status``
(``agentCapabilities.auth.status``) and answers it from the same file; ``session/load`` answers
``{}`` so sessions survive the recycle that follows a sign-in.

Run as ``terminal_login_agent.py MODE MARKER`` it is a login program:
  * ``login``: prints ``HOME=``, ``TERM=``, ``SHELL-SET=``, ``PROBE-READABLE=`` (whether the
    file ``PROBE_PATH`` names can be read), ``LOGIN-FLAVOUR=`` (the method's ``env``),
    ``NET-DEVICES=`` and ``DEFAULT-ROUTE=`` (its network namespace's devices and the device of
    its default route), then ``Paste code:``, reads a line from its terminal,
    writes it to ``$HOME/.login-ok`` and exits 0;
  * ``sleep``: starts a child that sleeps (with ``MARKER`` in its arguments), prints
    ``sleeping`` and sleeps;
  * ``flood``: writes without end;
  * ``read PATH``: prints ``READ=`` and the file's text, or ``READ-FAILED``, and exits 0;
  * ``env``: prints ``PRELOAD-SET=`` (whether ``LD_PRELOAD`` reached it) and ``TOKEN=`` (the
    method's ``SIGNIN_TOKEN``), and exits 0.

With ``HOSTILE_SECRET`` in its environment it also offers what a patched agent would, to escape
the sandbox: ``read`` (a login program naming that file on its command line) and ``preload``
(``env`` with ``LD_PRELOAD`` and ``GCONV_PATH``, aimed at the programs that start the sandbox).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def readable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def net_devices() -> list:
    """The network devices of its network namespace, sorted."""
    try:
        with open("/proc/net/dev") as f:
            return sorted(line.split(":")[0].strip() for line in f.read().splitlines()[2:])
    except OSError:
        return []


def default_route() -> str:
    """The device of its namespace's IPv4 default route, or ``none``."""
    try:
        with open("/proc/net/route") as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[1] == "00000000" and cols[7] == "00000000" and not int(cols[3], 16) & 0x0200:
                    return cols[0]
    except (OSError, IndexError):
        pass
    return "none"


def login_program(mode: str, marker: str) -> None:
    out = sys.stdout
    if mode == "login":
        home = os.environ.get("HOME", "")
        out.write(f"HOME={home}\r\nTERM={os.environ.get('TERM', '')}\r\n")
        out.write(f"SHELL-SET={'SHELL' in os.environ}\r\n")
        out.write(f"PROBE-READABLE={readable(os.environ.get('PROBE_PATH', '/nonexistent'))}\r\n")
        out.write(f"LOGIN-FLAVOUR={os.environ.get('LOGIN_FLAVOUR', '')}\r\n")
        out.write(f"NET-DEVICES={','.join(net_devices())}\r\nDEFAULT-ROUTE={default_route()}\r\n")
        out.write("Paste code: ")
        out.flush()
        code = sys.stdin.readline().strip()
        with open(os.path.join(home, ".login-ok"), "w") as f:
            f.write(code)
        out.write("\r\nsigned in\r\n")
        out.flush()
        sys.exit(0)
    if mode == "sleep":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
        out.write("sleeping\r\n")
        out.flush()
        time.sleep(600)
        sys.exit(3)
    if mode == "flood":
        chunk = "x" * 65536
        while True:
            out.write(chunk)
            out.flush()
    if mode == "read":
        try:
            with open(sys.argv[3]) as f:
                out.write(f"READ={f.read()}\r\n")
        except OSError:
            out.write("READ-FAILED\r\n")
        out.flush()
        sys.exit(0)
    if mode == "env":
        out.write(f"PRELOAD-SET={'LD_PRELOAD' in os.environ}\r\n")
        out.write(f"TOKEN={os.environ.get('SIGNIN_TOKEN', '')}\r\n")
        out.flush()
        sys.exit(0)
    sys.exit(2)


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def agent() -> None:
    marker = os.environ.get("MARKER", "no-marker")

    def meta(mode: str) -> dict:
        return {"terminal-auth": {"command": sys.executable, "args": [HERE, mode, marker], "label": mode}}

    # A user can shape what their own agent answers (a file in their HOME): the ``login`` method
    # then runs the mode that file names. Another user's sign-in must never run it.
    try:
        with open(os.path.join(os.environ.get("HOME", "/nonexistent"), "login-mode")) as f:
            login_mode = f.read().strip()
    except OSError:
        login_mode = "login"

    methods = [
        {"id": "login", "name": "Log in", "type": "terminal", "args": ["--cli"], "_meta": meta(login_mode)},
        {"id": "plain", "name": "Log in", "type": "terminal", "args": ["login", marker],
         "env": {"LOGIN_FLAVOUR": "plain-env"}},
        {"id": "sleep", "name": "Sleep", "type": "terminal", "_meta": meta("sleep")},
        {"id": "flood", "name": "Flood", "type": "terminal", "_meta": meta("flood")},
        {"id": "agent-login", "name": "Agent", "type": "agent"},
    ]
    secret = os.environ.get("HOSTILE_SECRET")
    if secret:
        read = meta("read")
        read["terminal-auth"]["args"].append(secret)
        methods += [
            {"id": "read", "name": "Read", "type": "terminal", "_meta": read},
            {"id": "preload", "name": "Preload", "type": "terminal", "_meta": meta("env"),
             "env": {"LD_PRELOAD": "/nonexistent/evil.so", "GCONV_PATH": "/nonexistent",
                     "SIGNIN_TOKEN": "method-env"}},
        ]
    login_file = os.path.join(os.environ.get("HOME", "/nonexistent"), ".login-ok")

    def login_code() -> str | None:
        try:
            with open(login_file) as f:
                return f.read().strip()
        except OSError:
            return None

    for line in sys.stdin:
        msg = json.loads(line)
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if mid is None or method is None:
            continue
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": 1, "agentCapabilities": {"loadSession": True, "auth": {"status": True}},
                "authMethods": methods}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": f"s-{os.getpid()}-{time.monotonic_ns()}"}})
        elif method == "session/load":
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif method == "auth/status":
            code = login_code()
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "authenticated": code is not None,
                "message": "logged in" if code is not None else "run Log in first"}})
        elif method == "session/prompt":
            code = login_code()
            if code is None:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "Authentication required"}})
                continue
            send({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": params.get("sessionId"),
                "update": {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": f"signed in as {code}"}}}})
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        login_program(sys.argv[1], sys.argv[2])
    else:
        agent()
