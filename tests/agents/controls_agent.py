#!/usr/bin/env python3
"""A stdio ACP v1 agent (standard library only) for tests/ui/controls.test.mjs: the session
controls `demo-agent --showcase` does not exercise.

* ``session/new`` answers with ``modes`` (normal, yolo) and ``configOptions``: a ``model`` select
  whose options are grouped (Fast / Smart, one of them ``broken``: choosing it is refused), and a
  ``boolean`` option (web search). 0.3 s later (as real agents do, from another task) it sends
  ``available_commands_update`` (/review with an input hint, /compact, /init).
* ``session/set_mode`` and ``session/set_config_option`` echo ``current_mode_update`` /
  ``config_option_update``.
* A prompt streams one line saying the current model, mode and web search, then a ``usage_update``
  (cost in EUR), and answers ``end_turn`` with PromptResponse ``usage`` tokens. A prompt with
  "switch yourself" makes the agent change its own mode to yolo (an unprompted
  ``current_mode_update``) and offer one more command (/yolo-only).
"""

from __future__ import annotations

import json
import sys
import threading
import uuid

lock = threading.Lock()
sessions: dict[str, dict] = {}

MODES = [
    {"id": "normal", "name": "Normal", "description": "Asks first"},
    {"id": "yolo", "name": "YOLO", "description": "Never asks"},
]
MODELS = [
    {"group": "fast", "name": "Fast", "options": [
        {"value": "mini", "name": "Mini", "description": "Small and quick"},
        {"value": "broken", "name": "Broken", "description": "Always refused"},
    ]},
    {"group": "smart", "name": "Smart", "options": [
        {"value": "maxi", "name": "Maxi", "description": "Large and slow"},
    ]},
]
COMMANDS = [
    {"name": "review", "description": "Review the changes", "input": {"hint": "what to review"}},
    {"name": "compact", "description": "Compact the conversation"},
    {"name": "init", "description": "Write an AGENTS.md"},
]


def send(msg: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def update(session_id: str, body: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": body}})


def config(s: dict) -> list:
    return [
        {"id": "model", "name": "Model", "description": "Which model answers", "category": "model",
         "type": "select", "currentValue": s["model"], "options": MODELS},
        {"id": "web", "name": "Web search", "description": "Let the agent search the web",
         "type": "boolean", "currentValue": s["web"]},
    ]


def modes(s: dict) -> dict:
    return {"currentModeId": s["mode"], "availableModes": MODES}


def set_config(s: dict, params: dict):
    cid, value = params.get("configId"), params.get("value")
    if cid == "model":
        if value == "broken":
            return None, (-32603, "model broken is unavailable right now")
        if value not in ("mini", "maxi"):
            return None, (-32602, "unknown model")
        s["model"] = value
    elif cid == "web":
        if params.get("type") != "boolean" or not isinstance(value, bool):
            return None, (-32602, "web takes {type: boolean, value: bool}")
        s["web"] = value
    else:
        return None, (-32602, "unknown configId")
    return config(s), None


def main() -> None:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        sid = params.get("sessionId", "")
        s = sessions.get(sid)
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": {},
                                                          "authMethods": []}})
        elif method == "session/new":
            sid = str(uuid.uuid4())
            s = sessions[sid] = {"mode": "normal", "model": "mini", "web": False, "used": 0, "cost": 0.0,
                                 "commands": list(COMMANDS)}
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": sid, "modes": modes(s),
                                                          "configOptions": config(s)}})
            threading.Timer(0.3, update, (sid, {"sessionUpdate": "available_commands_update",
                                                "availableCommands": s["commands"]})).start()
        elif s is None and rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": "no such session"}})
        elif method == "session/set_mode":
            if params.get("modeId") not in ("normal", "yolo"):
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "unknown mode"}})
                continue
            s["mode"] = params["modeId"]
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
            update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": s["mode"]})
        elif method == "session/set_config_option":
            options, err = set_config(s, params)
            if err:
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": err[0], "message": err[1]}})
                continue
            send({"jsonrpc": "2.0", "id": rid, "result": {"configOptions": options}})
            update(sid, {"sessionUpdate": "config_option_update", "configOptions": options})
        elif method == "session/prompt":
            text = " ".join(b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text")
            if "switch yourself" in text:
                s["mode"] = "yolo"
                update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": "yolo"})
                s["commands"] = s["commands"] + [{"name": "yolo-only", "description": "Only in YOLO mode"}]
                update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": s["commands"]})
            reply = f"model={s['model']} mode={s['mode']} web={'on' if s['web'] else 'off'}"
            update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": reply}})
            s["used"] += 1500
            s["cost"] += 0.25
            update(sid, {"sessionUpdate": "usage_update", "used": s["used"], "size": 10000,
                         "cost": {"amount": round(s["cost"], 2), "currency": "EUR"}})
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn", "usage": {
                "totalTokens": 1234, "inputTokens": 1000, "outputTokens": 200, "thoughtTokens": 34}}})
        elif method == "session/cancel":
            pass
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
