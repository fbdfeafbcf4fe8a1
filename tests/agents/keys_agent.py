#!/usr/bin/env python3
"""A test agent that signs in the way codex-acp does: an ``env_var`` method (the client supplies
``OPENAI_API_KEY``) beside an ``agent`` method. Standard library only, ACP v1 over stdio.

* At start it writes ``$HOME/keys-agent-env.json``: which of its variables it was given (the last
  four characters of each value only).
* ``session/prompt`` answers ``-32000`` (authentication required) unless ``OPENAI_API_KEY`` is
  set; then it streams one chunk naming the key's last four characters and ends its turn.
* ``session/resume`` and ``session/load`` answer ``{}``, so sessions survive a recycled process.
* It advertises ``auth.logout``; ``logout`` writes ``$HOME/keys-agent-logged-out`` and forgets
  the device login below.
* ``authenticate`` with ``chatgpt`` is a device login, as an agent does it for a person who is
  elsewhere: it writes ``Open URL and enter code CODE`` on stderr and sends the same as a
  notification of its own (``_keys_agent/device_code``), then waits (up to 60 s) until
  ``$HOME/device-approved`` exists (the person approved it), writes ``$HOME/keys-agent-login`` and
  answers ``{}``. Prompts then work without a key.
* With ``--load-needs-login``, ``session/load`` and ``session/resume`` answer ``-32000`` too until
  it has a key or a login (an agent that will not restore a session for a signed-out user).
* ``authenticate`` with ``sso`` is refused: ``-32000``, "SSO is not enabled for this workspace".
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

HOME = os.environ.get("HOME", "/nonexistent")
KEY = "OPENAI_API_KEY"
LOGIN = os.path.join(HOME, "keys-agent-login")
APPROVED = os.path.join(HOME, "device-approved")
DEVICE_URL = "https://auth.example.test/device"
DEVICE_CODE = "WXYZ-1234"
LOAD_NEEDS_LOGIN = "--load-needs-login" in sys.argv[1:]


def signed_in() -> bool:
    return bool(os.environ.get(KEY)) or os.path.exists(LOGIN)


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def tail(value: str | None) -> str | None:
    return None if value is None else value[-4:]


def device_login(mid) -> None:
    print(f"Open {DEVICE_URL} and enter code {DEVICE_CODE}", file=sys.stderr, flush=True)
    print("debug: polling the token endpoint", file=sys.stderr, flush=True)
    send({"jsonrpc": "2.0", "method": "_keys_agent/device_code",
          "params": {"userCode": DEVICE_CODE, "verificationUri": DEVICE_URL}})
    deadline = time.monotonic() + 60
    while not os.path.exists(APPROVED):
        if time.monotonic() > deadline:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "The device code expired"}})
            return
        time.sleep(0.05)  # a device login polls its provider
    with open(LOGIN, "w") as f:
        f.write("chatgpt")
    send({"jsonrpc": "2.0", "id": mid, "result": {}})


def main() -> None:
    with open(os.path.join(HOME, "keys-agent-env.json"), "w") as f:
        json.dump({KEY: tail(os.environ.get(KEY)), "pid": os.getpid()}, f)
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if mid is None or method is None:
            continue
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}},
                                      "auth": {"logout": {}}},
                "authMethods": [
                    {"id": "chatgpt", "name": "Sign in with ChatGPT", "description": "the agent's own login"},
                    {"id": "sso", "name": "Company SSO", "description": "single sign-on through your company"},
                    {"id": "openai-key", "type": "env_var", "name": "OpenAI API key", "vars": [{"name": KEY}]},
                ],
                "agentInfo": {"name": "keys-agent", "version": "1"},
            }
        elif method == "session/new":
            result = {"sessionId": f"keys-{uuid.uuid4().hex}"}
        elif method in ("session/load", "session/resume"):
            if LOAD_NEEDS_LOGIN and not signed_in():
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "Authentication required"}})
                continue
            result = {}
        elif method == "logout":
            with open(os.path.join(HOME, "keys-agent-logged-out"), "w") as f:
                f.write("yes")
            for path in (LOGIN, APPROVED):
                if os.path.exists(path):
                    os.remove(path)
            result = {}
        elif method == "authenticate" and params.get("methodId") == "chatgpt":
            device_login(mid)
            continue
        elif method == "authenticate":
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "SSO is not enabled for this workspace"}})
            continue
        elif method == "session/prompt":
            key = os.environ.get(KEY)
            said = f"signed in with a key ending {tail(key)}" if key else "signed in with ChatGPT"
            if not signed_in():
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "Authentication required"}})
                continue
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": params.get("sessionId"),
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": said},
                        },
                    },
                }
            )
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
