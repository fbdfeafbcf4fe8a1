#!/usr/bin/env python3
"""A small ACP v1 stdio agent (standard library only) whose modes and config options change on
its own, as real agents' do (a coding agent leaving plan mode by itself): for the gateway's
session-controls tests.

``session/new`` answers with ``modes`` (``ask``, ``code``) and ``configOptions`` (a ``model``
select). A prompt whose text is ``mode:ID`` sends ``current_mode_update`` for ``ID``; one that is
``model:VALUE`` sends ``config_option_update`` with the model select set to ``VALUE``; every
prompt then ends its turn. ``session/load`` and ``session/resume`` answer ``{}`` (an agent that
keeps nothing across processes and says nothing about its controls).
"""

from __future__ import annotations

import json
import sys
import uuid


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def modes(current: str) -> dict:
    return {
        "currentModeId": current,
        "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}],
    }


def options(model: str) -> list:
    return [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": model,
            "options": [{"value": "small", "name": "Small"}, {"value": "large", "name": "Large"}],
        }
    ]


def update(session: str, body: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": body}})


def main() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None or rid is None:
            continue
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}}},
            }
        elif method == "session/new":
            result = {"sessionId": f"modes-{uuid.uuid4()}", "modes": modes("ask"), "configOptions": options("small")}
        elif method in ("session/load", "session/resume"):
            result = {}
        elif method == "session/prompt":
            session = params["sessionId"]
            text = "".join(b.get("text", "") for b in params.get("prompt", []))
            if text.startswith("mode:"):
                update(session, {"sessionUpdate": "current_mode_update", "currentModeId": text[5:]})
            elif text.startswith("model:"):
                update(session, {"sessionUpdate": "config_option_update", "configOptions": options(text[6:])})
            update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ok"}})
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
