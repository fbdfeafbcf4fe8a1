#!/usr/bin/env python3
"""Standalone smoke test for sdk_echo_agent.py (no gateway involved).

Spawns the agent as a subprocess and speaks raw newline-delimited JSON-RPC 2.0
to it using only the standard library, so the checks are independent of the
SDK under test. Exit code 0 on success, 1 on the first failed check.

    python3 tests/agents/smoke_sdk_agent.py [--agent PATH] [-v]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 10.0


class Failure(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failure(msg)
    print(f"ok   {msg}")


class RawPeer:
    """Minimal NDJSON JSON-RPC peer over a child's stdin/stdout."""

    def __init__(self, argv: list[str], verbose: bool) -> None:
        self.verbose = verbose
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.non_json: list[str] = []
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.next_id = 1

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                self.non_json.append(line)
                continue
            if self.verbose:
                print(f"<-   {line}")
            self.inbox.put(msg)
        self.inbox.put(None)  # EOF

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def send(self, msg: dict[str, Any]) -> None:
        line = json.dumps(msg, separators=(",", ":"))
        if self.verbose:
            print(f"->   {line}")
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def recv(self) -> dict[str, Any]:
        try:
            msg = self.inbox.get(timeout=TIMEOUT)
        except queue.Empty:
            raise Failure(f"timed out after {TIMEOUT}s waiting for a message") from None
        if msg is None:
            raise Failure(f"agent closed stdout; stderr: {self.stderr_lines[-10:]}")
        return msg

    def wait_response(self, rid: int, on_request=None) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """Read until the response to ``rid``; returns (response, updates, agent->client requests)."""
        updates: list[dict[str, Any]] = []
        requests: list[dict[str, Any]] = []
        while True:
            msg = self.recv()
            if "method" in msg and "id" in msg:
                requests.append(msg)
                if on_request is None:
                    raise Failure(f"unexpected agent->client request: {msg}")
                on_request(msg)
            elif msg.get("method") == "session/update":
                updates.append(msg)
            elif "method" in msg:
                raise Failure(f"unexpected notification: {msg}")
            elif msg.get("id") == rid:
                return msg, updates, requests
            else:
                raise Failure(f"response for unexpected id: {msg}")

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failure("agent did not exit after stdin EOF") from None


def chunk_texts(updates: list[dict[str, Any]], session_id: str) -> list[str]:
    out = []
    for u in updates:
        p = u["params"]
        check(p["sessionId"] == session_id, f"update is for session {session_id}")
        up = p["update"]
        check(up["sessionUpdate"] == "agent_message_chunk", "update kind is agent_message_chunk")
        check(up["content"]["type"] == "text", "chunk content is a text block")
        out.append(up["content"]["text"])
    return out


def answer_permission(peer: RawPeer, option_id: str | None, session_id: str, before=None):
    def handler(req: dict[str, Any]) -> None:
        check(req["method"] == "session/request_permission", "agent sent session/request_permission")
        p = req["params"]
        check(p["sessionId"] == session_id, "permission request carries our sessionId")
        check("toolCallId" in p["toolCall"], "permission request has toolCall.toolCallId")
        opts = {o["optionId"]: o["kind"] for o in p["options"]}
        check(opts == {"allow": "allow_once", "reject": "reject_once"}, f"permission options {opts}")
        if before:
            before()
        outcome = {"outcome": "cancelled"} if option_id is None else {"outcome": "selected", "optionId": option_id}
        peer.send({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": outcome}})

    return handler


def run(agent: str, verbose: bool) -> None:
    peer = RawPeer([sys.executable, agent], verbose)
    try:
        # initialize
        rid = peer.request(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
                "clientInfo": {"name": "smoke", "version": "0"},
            },
        )
        resp, _, _ = peer.wait_response(rid)
        print("     initialize ->", json.dumps(resp["result"]))
        check(resp["result"]["protocolVersion"] == 1, "initialize: protocolVersion 1")
        # The SDK serialises with exclude_unset, so default capabilities come out
        # as `{}` (loadSession omitted == false). Clients/gateways must cope.
        caps = resp["result"].get("agentCapabilities", {})
        check(caps.get("loadSession", False) is False, "initialize: loadSession absent/false")

        # session/new
        rid = peer.request("session/new", {"cwd": "/tmp", "mcpServers": []})
        resp, _, _ = peer.wait_response(rid)
        sid = resp["result"]["sessionId"]
        print("     session/new ->", json.dumps(resp["result"]))
        check(isinstance(sid, str) and sid, "session/new returns a sessionId")

        # prompt with permission, answered allow
        rid = peer.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hello [permission]"}]})
        resp, updates, reqs = peer.wait_response(rid, answer_permission(peer, "allow", sid))
        texts = chunk_texts(updates, sid)
        print("     chunks:", json.dumps(texts))
        print("     session/prompt ->", json.dumps(resp["result"]))
        check(len(reqs) == 1, "exactly one permission request")
        check(len(texts) == 3, "3 agent_message_chunk updates")
        check(all(f"part {i}/3" in t for i, t in enumerate(texts, 1)), "chunks numbered part i/3")
        check(all("allowed" in t and "hello [permission]" in t for t in texts), "chunks echo the text and say 'allowed'")
        check(resp["result"] == {"stopReason": "end_turn"}, "stopReason end_turn")

        # prompt with permission, answered reject
        rid = peer.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "again [permission]"}]})
        resp, updates, _ = peer.wait_response(rid, answer_permission(peer, "reject", sid))
        texts = chunk_texts(updates, sid)
        print("     chunks:", json.dumps(texts))
        check(len(texts) == 3 and all("rejected" in t for t in texts), "reject -> 3 chunks saying 'rejected'")
        check(resp["result"] == {"stopReason": "end_turn"}, "stopReason end_turn")

        # plain prompt: no permission request
        rid = peer.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "plain"}]})
        resp, updates, _ = peer.wait_response(rid)
        texts = chunk_texts(updates, sid)
        print("     chunks:", json.dumps(texts))
        check(texts == [f"part {i}/3: sdk-echo: plain" for i in (1, 2, 3)], "plain prompt echoed without permission")
        check(resp["result"] == {"stopReason": "end_turn"}, "stopReason end_turn")

        # cancel while a permission request is pending -> stopReason cancelled
        rid = peer.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x [permission]"}]})
        resp, updates, _ = peer.wait_response(
            rid,
            answer_permission(peer, None, sid, before=lambda: (peer.notify("session/cancel", {"sessionId": sid}), time.sleep(0.2))),
        )
        print("     cancelled prompt ->", json.dumps(resp["result"]), f"({len(updates)} updates)")
        check(resp["result"] == {"stopReason": "cancelled"}, "session/cancel during permission -> stopReason cancelled")

        # unknown session and unsupported method produce JSON-RPC errors, agent survives
        rid = peer.request("session/prompt", {"sessionId": "nope", "prompt": [{"type": "text", "text": "x"}]})
        resp, _, _ = peer.wait_response(rid)
        check("error" in resp, f"prompt on unknown session -> error {resp.get('error', {}).get('code')}")
        rid = peer.request("session/load", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})
        resp, _, _ = peer.wait_response(rid)
        check(resp.get("error", {}).get("code") == -32601, "session/load -> -32601 method not found")

        check(not peer.non_json, f"stdout carried only JSON lines {peer.non_json[:3]}")
        code = peer.close()
        check(code == 0, "agent exits 0 on stdin EOF")
    finally:
        if peer.proc.poll() is None:
            peer.proc.kill()
            peer.proc.wait()
    if peer.stderr_lines and verbose:
        print("agent stderr:\n  " + "\n  ".join(peer.stderr_lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default=os.path.join(HERE, "sdk_echo_agent.py"))
    ap.add_argument("-v", "--verbose", action="store_true", help="print raw wire traffic")
    args = ap.parse_args()
    try:
        run(args.agent, args.verbose)
    except Failure as exc:
        print(f"FAIL {exc}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
