#!/usr/bin/env python3
"""A test agent that asks its user things with ACP ``elicitation/create`` (standard library only,
ACP v1 over stdio). A prompt ``form`` asks with a form (a choice, an integer, a boolean), ``url``
with a URL; either way the turn waits for the answer, then streams ``answer: <the result as
JSON>`` and ends. Anything else is echoed.
"""

from __future__ import annotations

import json
import sys
import uuid

FORM = {
    "mode": "form",
    "message": "Where should this deploy?",
    "requestedSchema": {
        "type": "object",
        "properties": {
            "env": {"type": "string", "title": "Environment", "enum": ["staging", "production"]},
            "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 5},
            "confirm": {"type": "boolean", "title": "I have checked the plan"},
        },
        "required": ["env", "replicas"],
    },
}
URL = {
    "mode": "url",
    "message": "Authorize the deployment bot",
    "url": "https://example.com/device?code=ABCD-1234",
    "elicitationId": "el-1",
}


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def chunk(sid: str, text: str) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})


def main() -> None:
    waiting: dict = {}  # our request id -> (prompt id, session id)
    for line in sys.stdin:
        msg = json.loads(line)
        mid, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
        if method is None and mid in waiting:
            prompt_id, sid = waiting.pop(mid)
            chunk(sid, "answer: " + json.dumps(msg.get("result", msg.get("error")), sort_keys=True))
            send({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "end_turn"}})
            continue
        if mid is None or method is None:
            continue
        if method == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True},
                      "agentInfo": {"name": "elicit-agent", "version": "1"}}
        elif method == "session/new":
            result = {"sessionId": f"elicit-{uuid.uuid4().hex}"}
        elif method in ("session/load", "session/resume"):
            result = {}
        elif method == "session/prompt":
            sid = params.get("sessionId")
            text = " ".join(b.get("text", "") for b in params.get("prompt", []) if isinstance(b, dict)).strip()
            if text in ("form", "url"):
                ask = f"ask-{uuid.uuid4().hex[:8]}"
                waiting[ask] = (mid, sid)
                send({"jsonrpc": "2.0", "id": ask, "method": "elicitation/create",
                      "params": {"sessionId": sid, **(FORM if text == "form" else URL)}})
                continue
            chunk(sid, f"you said: {text}")
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
