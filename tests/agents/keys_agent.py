#!/usr/bin/env python3
"""A test agent that signs in the way codex-acp does: an ``env_var`` method (the client supplies
``OPENAI_API_KEY``) beside an ``agent`` method. Standard library only, ACP v1 over stdio.

* At start it writes ``$HOME/keys-agent-env.json``: which of its variables it was given (the last
  four characters of each value only).
* ``session/prompt`` answers ``-32000`` (authentication required) unless ``OPENAI_API_KEY`` is
  set; then it streams one chunk naming the key's last four characters and ends its turn.
* ``session/resume`` and ``session/load`` answer ``{}``, so sessions survive a recycled process.
* It advertises ``auth.logout``; ``logout`` writes ``$HOME/keys-agent-logged-out``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

HOME = os.environ.get("HOME", "/nonexistent")
KEY = "OPENAI_API_KEY"


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def tail(value: str | None) -> str | None:
    return None if value is None else value[-4:]


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
                    {"id": "openai-key", "type": "env_var", "name": "OpenAI API key", "vars": [{"name": KEY}]},
                ],
                "agentInfo": {"name": "keys-agent", "version": "1"},
            }
        elif method == "session/new":
            result = {"sessionId": f"keys-{uuid.uuid4().hex}"}
        elif method in ("session/load", "session/resume"):
            result = {}
        elif method == "logout":
            with open(os.path.join(HOME, "keys-agent-logged-out"), "w") as f:
                f.write("yes")
            result = {}
        elif method == "session/prompt":
            key = os.environ.get(KEY)
            if not key:
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
                            "content": {"type": "text", "text": f"signed in with a key ending {tail(key)}"},
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
