#!/usr/bin/env python3
"""An ACP v1 stdio agent (standard library only) that talks the moment it has answered, as
claude-code-acp and codex-acp do: for the gateway's tests of updates that arrive before it has
routed a session.

``session/new`` writes, in one write: its answer, an update for a session it never creates
(``ghost-…``), then ``available_commands_update`` and ``agent_message_chunk`` "early 1" … "early N"
(``--early N``, default 5) for the new session. ``session/load`` and ``session/resume`` replay
"replayed 1" … "replayed 3" for the session before answering ``{}`` (as an agent that keeps its
history does), then say "after restore". A prompt answers one chunk "reply: <text>" and
``end_turn``.
"""

from __future__ import annotations

import json
import sys
import uuid

ARGS = sys.argv[1:]
EARLY = int(ARGS[ARGS.index("--early") + 1]) if "--early" in ARGS else 5


def line(msg: dict) -> str:
    return json.dumps(msg) + "\n"


def update(session: str, body: dict) -> str:
    return line({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": body}})


def chunk(session: str, text: str) -> str:
    return update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def answer(rid, result: dict) -> str:
    return line({"jsonrpc": "2.0", "id": rid, "result": result})


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main() -> None:
    for raw in sys.stdin:
        msg = json.loads(raw)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None or rid is None:
            continue
        sid = params.get("sessionId")
        if method == "initialize":
            write(answer(rid, {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}}},
                "agentInfo": {"name": "early-updates-agent", "version": "1"},
            }))
        elif method == "session/new":
            sid = f"early-{uuid.uuid4().hex}"
            out = answer(rid, {"sessionId": sid})
            out += chunk(f"ghost-{uuid.uuid4().hex}", "for nobody")
            out += update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": [
                {"name": "early", "description": "a command announced right after session/new"},
            ]})
            out += "".join(chunk(sid, f"early {i}") for i in range(1, EARLY + 1))
            write(out)
        elif method in ("session/load", "session/resume"):
            out = "".join(chunk(sid, f"replayed {i}") for i in range(1, 4))
            out += answer(rid, {})
            out += chunk(sid, "after restore")
            write(out)
        elif method == "session/prompt":
            text = next((b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text"), "")
            write(chunk(sid, f"reply: {text}") + answer(rid, {"stopReason": "end_turn"}))
        elif method == "session/close":
            write(answer(rid, {}))
        else:
            write(line({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"unknown {method}"}}))


if __name__ == "__main__":
    main()
