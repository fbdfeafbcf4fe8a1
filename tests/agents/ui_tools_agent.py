#!/usr/bin/env python3
"""A stdio ACP v1 agent (standard library only) for tests/ui/tools.test.mjs: every prompt gets
the tool calls the web UI's cards must handle beyond what `demo-agent --showcase` sends.

It writes ``tools-fixture/lib.rs`` under the session cwd (so the file viewer can open it), then
sends, in this order:
  * ``read`` pending → in_progress → completed, located at lib.rs line 40 (a file of 120 lines);
  * ``edit`` with a two-hunk ``diff`` of lib.rs (changes near line 5 and line 100);
  * ``edit`` creating ``big.txt`` (``oldText`` null, 2,500 lines: over the web UI's row cap);
  * ``edit`` rewriting every line of a 1,000-line file (too slow a diff for the page: the worker);
  * ``execute`` (``rawInput.command``) whose text is ANSI-coloured, streamed in two updates;
  * ``fetch`` that fails, with a ``rawInput`` object and an HTML-looking title;
  * ``execute`` with ``terminal`` content (the web UI offers no terminals);
  * ``execute`` with ``terminal`` content whose output comes in ``_meta.terminal_output`` /
    ``terminal_exit`` (claude-code-acp's convention);
  * ``search`` located at a path outside every workspace root (``/etc/hostname``), its output
    Markdown with a code block.
Then it answers ``end_turn``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

ESC = "\x1b"
sessions: dict[str, str] = {}


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def update(session_id: str, body: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": body}})


def lib_text(version: int) -> str:
    lines = [f"// line {n}: fixture for the file viewer" for n in range(1, 121)]
    lines[0] = "//! A fixture the tool-call test opens in the file viewer."
    lines[39] = "pub fn answer() -> u32 { 42 } // line 40: the read location"
    if version == 2:
        lines[4] = "// line 5: fixture for the diff viewer"
        lines[99] = "// line 100: changed near the end"
        lines.insert(100, "// line 100b: added by the edit")
    return "\n".join(lines) + "\n"


def prompt(session_id: str) -> None:
    cwd = sessions.get(session_id, os.getcwd())
    folder = os.path.join(cwd, "tools-fixture")
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, "lib.rs")
    with open(lib, "w") as f:
        f.write(lib_text(1))

    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-read", "title": "Read lib.rs",
                        "kind": "read", "status": "pending", "locations": [{"path": lib, "line": 40}],
                        "rawInput": {"path": lib, "offset": 30, "limit": 20}})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-read", "status": "in_progress"})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-read", "status": "completed",
                        "content": [{"type": "content", "content": {"type": "text", "text": lib_text(1)[:400]}}]})

    with open(lib, "w") as f:
        f.write(lib_text(2))
    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-edit", "title": "Edit lib.rs",
                        "kind": "edit", "status": "completed", "locations": [{"path": lib, "line": 5}],
                        "content": [{"type": "diff", "path": lib, "oldText": lib_text(1), "newText": lib_text(2)}]})

    big = os.path.join(folder, "big.txt")
    big_text = "".join(f"row {n}\n" for n in range(1, 2501))
    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-big", "title": "Write big.txt",
                        "kind": "edit", "status": "completed",
                        "content": [{"type": "diff", "path": big, "oldText": None, "newText": big_text}]})

    rewrite = os.path.join(folder, "rewrite.txt")
    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-rewrite", "title": "Rewrite rewrite.txt",
                        "kind": "edit", "status": "completed",
                        "content": [{"type": "diff", "path": rewrite,
                                     "oldText": "".join(f"old {n}\n" for n in range(1, 2501)),
                                     "newText": "".join(f"new {n}\n" for n in range(1, 2501))}]})

    first = f"{ESC}[1m{ESC}[32m   Compiling{ESC}[0m fixture v0.1.0\n"
    second = (f"running 2 tests\ntest ok_case ... {ESC}[32mok{ESC}[0m\n"
              f"test bad_case ... {ESC}[31mFAILED{ESC}[0m\n{ESC}]8;;https://example.com{ESC}\\link{ESC}]8;;{ESC}\\\n"
              f"progress 10%\rprogress 100%\n{ESC}[38;2;255;128;0mtruecolor{ESC}[0m {ESC}[4munderlined{ESC}[0m\n")
    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-exec", "title": "cargo test",
                        "kind": "execute", "status": "in_progress",
                        "rawInput": {"command": "cargo test --color=always", "description": "Run the tests"},
                        "content": [{"type": "content", "content": {"type": "text", "text": first}}]})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-exec", "status": "failed",
                        "content": [{"type": "content", "content": {"type": "text", "text": first + second}}]})

    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-fetch",
                        "title": "<img src=x onerror=alert(1)> fetch", "kind": "fetch", "status": "pending",
                        "rawInput": {"url": "https://example.invalid/", "headers": {"accept": "text/html"}}})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-fetch", "status": "failed",
                        "content": [{"type": "content", "content": {"type": "text", "text": "connection refused"}}]})

    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-term", "title": "npm run dev",
                        "kind": "execute", "status": "in_progress",
                        "rawInput": {"command": "npm run dev"},
                        "content": [{"type": "terminal", "terminalId": "term-1"}]})

    # claude-code-acp's convention for output of a terminal the client does not host: `_meta`.
    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-meta", "title": "cargo build",
                        "kind": "execute", "status": "in_progress", "rawInput": {"command": "cargo build"},
                        "content": [{"type": "terminal", "terminalId": "m1"}],
                        "_meta": {"terminal_info": {"terminal_id": "m1"}}})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-meta",
                        "_meta": {"terminal_output": {"terminal_id": "m1", "data": f"{ESC}[33mwarning{ESC}[0m: unused\n"}}})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-meta",
                        "_meta": {"terminal_output": {"terminal_id": "m1", "data": "    Finished dev\n"}}})
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "t-meta", "status": "completed",
                        "_meta": {"terminal_exit": {"terminal_id": "m1", "exit_code": 0, "signal": None}}})

    update(session_id, {"sessionUpdate": "tool_call", "toolCallId": "t-outside", "title": "Search /etc",
                        "kind": "search", "status": "completed",
                        "locations": [{"path": "/etc/hostname", "line": 1}],
                        "content": [{"type": "content", "content": {"type": "text", "text":
                                     "Found **1** match:\n\n```text\n/etc/hostname:1: localhost\n```\n"}}]})


def main() -> None:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": {},
                                                          "authMethods": []}})
        elif method == "session/new":
            sid = str(uuid.uuid4())
            sessions[sid] = params.get("cwd") or os.getcwd()
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": sid}})
        elif method == "session/prompt":
            prompt(params.get("sessionId", ""))
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
