#!/usr/bin/env python3
"""A raw ACP-over-WebSocket client for scripts/container-test.sh (no SDK: it checks the frames).

    smoke_client.py URL TOKEN prompt STATE      initialize, session/new, one prompt with a
                                                permission round trip; checks the stream
    smoke_client.py URL TOKEN stream STATE MARK  a long prompt on the same session; touches MARK
                                                once it streams, then expects the prompt's answer
                                                (cancelled after the drain grace) and then the
                                                close with 1001 (going away) as the gateway drains
    smoke_client.py URL TOKEN load STATE        session/load on a new gateway over the same data:
                                                every update seen before is replayed, same seq
                                                and content

STATE is a JSON file the modes share (session id, cwd, every update seen by seq). Exit 0 when
every check holds; otherwise a message on stderr and exit 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import websockets

try:  # websockets >= 14
    from websockets.asyncio.client import connect as ws_connect

    HEADERS_KW = "additional_headers"
except ImportError:  # older releases
    from websockets import connect as ws_connect  # type: ignore

    HEADERS_KW = "extra_headers"

CHUNKS = 5  # the agent runs as `demo-agent --chunks 5` (ACP_GATEWAY_AGENT)
PROMPT = "hello from a container [permission] [title=container test]"


class Failure(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failure(msg)


class Conn:
    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.updates: list[dict] = []  # session/update params, in arrival order
        self.permissions = 0

    async def send(self, msg: dict) -> None:
        await self.ws.send(json.dumps(msg))

    async def request(self, method: str, params: dict, on_update=None) -> dict:
        self.next_id += 1
        rid = self.next_id
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("method") == "session/update":
                self.updates.append(msg["params"])
                if on_update:
                    on_update(msg["params"])
            elif msg.get("method") == "session/request_permission" and "id" in msg:
                self.permissions += 1
                options = msg["params"]["options"]
                allow = next(o for o in options if o["kind"].startswith("allow"))
                await self.send(
                    {
                        "jsonrpc": "2.0",
                        "id": msg["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}},
                    }
                )
            elif msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise Failure(f"{method} answered {msg['error']}")
                return msg["result"]


def seq_of(params: dict) -> int:
    return params["_meta"]["gateway"]["seq"]


async def open_conn(url: str, token: str) -> Conn:
    ws = await ws_connect(url, **{HEADERS_KW: {"Authorization": f"Bearer {token}"}}, max_size=None)
    conn = Conn(ws)
    response = getattr(ws, "response", None)
    if response is not None:
        check(bool(response.headers.get("Acp-Connection-Id")), "the 101 carries no Acp-Connection-Id")
    init = await conn.request(
        "initialize",
        {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "container-test", "version": "1"}},
    )
    check(init.get("protocolVersion") == 1, f"initialize: protocolVersion {init.get('protocolVersion')}")
    check(init["agentCapabilities"].get("loadSession") is True, "initialize: no loadSession")
    return conn


def record(state: dict, updates: list[dict]) -> None:
    seen = state.setdefault("seen", {})
    for u in updates:
        seen[str(seq_of(u))] = u["update"]


async def prompt_mode(url: str, token: str, state: dict) -> None:
    conn = await open_conn(url, token)
    cwd = "/var/lib/acp-gateway/data/workspaces/alice"
    new = await conn.request("session/new", {"cwd": cwd, "mcpServers": []})
    sid = new["sessionId"]
    check(len(sid) >= 32, f"session id {sid!r} looks short")
    result = await conn.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": PROMPT}]}
    )
    check(result.get("stopReason") == "end_turn", f"prompt ended with {result}")
    check(conn.permissions == 1, f"{conn.permissions} permission requests, expected 1")
    check(all(u["sessionId"] == sid for u in conn.updates), "an update for another session")
    seqs = [seq_of(u) for u in conn.updates]
    check(seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] in (1, 2), f"seqs not 1, 2, 3…: {seqs}")
    kinds = [u["update"]["sessionUpdate"] for u in conn.updates]
    for kind in ("plan", "tool_call", "tool_call_update", "agent_message_chunk"):
        check(kind in kinds, f"no {kind} among the updates: {kinds}")
    text = "".join(
        u["update"]["content"]["text"] for u in conn.updates if u["update"]["sessionUpdate"] == "agent_message_chunk"
    )
    lines = text.strip().split("\n")
    check(len(lines) == CHUNKS, f"{len(lines)} answer chunks, expected {CHUNKS}: {text!r}")
    for i, line in enumerate(lines, 1):
        check(line.startswith(f"chunk {i}/{CHUNKS}: ") and line.endswith(f"you said: {PROMPT}"), f"answer line {line!r}")
    listed = await conn.request("session/list", {})
    check([s["sessionId"] for s in listed["sessions"]] == [sid], f"session/list: {listed}")
    state.update(sessionId=sid, cwd=cwd)
    record(state, conn.updates)
    await conn.ws.close()
    print(f"prompt: {len(seqs)} updates (seq {seqs[0]}..{seqs[-1]}), permission answered, answer {len(lines)} chunks")


async def stream_mode(url: str, token: str, state: dict, mark: str) -> None:
    conn = await open_conn(url, token)
    sid = state["sessionId"]
    await conn.request("session/resume", {"sessionId": sid, "cwd": state["cwd"], "mcpServers": []})
    streamed = 0

    def on_update(params: dict) -> None:
        nonlocal streamed
        streamed += 1
        if streamed == 20:
            with open(mark, "w") as f:
                f.write("streaming\n")

    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "a long one [chunks=3000] [delay_us=5000]"}]}
    code = None
    result = None
    try:
        # Draining, the prompt runs on for drain_grace_secs (10 s of its 15), is cancelled, and
        # its answer comes before the close.
        result = await conn.request("session/prompt", prompt, on_update)
        extra = await conn.ws.recv()
        raise Failure(f"the gateway sent {extra!r} after the prompt's answer instead of closing")
    except websockets.ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd else None
    check(
        result is not None and result.get("stopReason") in ("cancelled", "end_turn"),
        f"the prompt's answer did not come before the close: {result}",
    )
    record(state, conn.updates)
    seqs = [seq_of(u) for u in conn.updates]
    check(seqs == list(range(seqs[0], seqs[0] + len(seqs))), "seqs with gaps while streaming")
    check(code == 1001, f"the gateway closed the socket with {code}, expected 1001 (going away)")
    print(
        f"stream: {len(seqs)} updates (seq {seqs[0]}..{seqs[-1]}), answer {result['stopReason']},"
        f" then the gateway closed with {code}"
    )


async def load_mode(url: str, token: str, state: dict) -> None:
    conn = await open_conn(url, token)
    sid = state["sessionId"]
    await conn.request("session/load", {"sessionId": sid, "cwd": state["cwd"], "mcpServers": []})
    replayed = {seq_of(u): u["update"] for u in conn.updates}
    seen = {int(k): v for k, v in state["seen"].items()}
    missing = [s for s in seen if s not in replayed]
    check(not missing, f"{len(missing)} updates a client saw are not replayed (first: seq {min(missing or [0])})")
    differ = [s for s in seen if replayed[s] != seen[s]]
    check(not differ, f"{len(differ)} replayed updates differ from what was seen (first: seq {min(differ or [0])})")
    check(sorted(replayed) == list(range(1, len(replayed) + 1)), "the replay's seqs are not 1, 2, 3…")
    await conn.ws.close()
    print(f"load: {len(replayed)} updates replayed, all {len(seen)} seen before identical")


def main() -> int:
    url, token, mode, state_path = sys.argv[1:5]
    state = json.load(open(state_path)) if os.path.exists(state_path) else {}
    try:
        if mode == "prompt":
            asyncio.run(prompt_mode(url, token, state))
        elif mode == "stream":
            asyncio.run(stream_mode(url, token, state, sys.argv[5]))
        elif mode == "load":
            asyncio.run(load_mode(url, token, state))
        else:
            raise Failure(f"unknown mode {mode}")
    except (Failure, websockets.WebSocketException, OSError, KeyError, StopIteration) as e:
        print(f"{mode}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        with open(state_path, "w") as f:
            json.dump(state, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
