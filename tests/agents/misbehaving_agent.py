#!/usr/bin/env python3
"""A misbehaving ACP v1 stdio agent for the fault tests (standard library only).

By default it is a well-behaved agent: several sessions per process, ``session/load`` and
``session/resume`` (so the gateway can restore its sessions on a fresh process), and on each
prompt it streams ``[chunks=N]`` (default 3) ``agent_message_chunk`` updates whose text is
``chunk I/N: <prompt text>``, then answers ``end_turn``.

Faults chosen on the command line, for the whole life of the process:
  ``--exit-at-start``   writes a line to stderr and exits with code 3 before reading anything.
  ``--mute-init``       reads its input forever and never answers anything (not even
                        ``initialize``).
  ``--garbage-always``  writes non-JSON-RPC garbage lines before every message it sends.
  ``--mute-controls``   never answers ``session/set_mode``, ``session/set_model`` or
                        ``session/set_config_option``.

Faults chosen per prompt, by markers in the prompt's text:
  ``[garbage]``         garbage lines before each message of this prompt.
  ``[fuzz=N:SEED]``     N random lines (valid UTF-8, seeded) before the reply: random text, random
                        JSON values, JSON-RPC-shaped messages with random members. None of them
                        names a real session or an id the gateway is waiting on.
  ``[huge-update=B]``   first an update for the prompt's session on one line of B bytes.
  ``[huge-answer=B]``   the prompt's answer is one line of B bytes (padded in ``_meta``).
  ``[unknown-ids]``     answers to ids the gateway never used (and to ids of types it never
                        uses) before the reply, and the prompt answered twice.
  ``[foreign-session]`` updates for sessions that do not exist (and malformed ones), and a
                        ``session/request_permission`` for a session that does not exist; the
                        answer it got is reported in a chunk ``foreign answer: <json>``.
  ``[permission]``      asks ``session/request_permission`` for the prompt's session and
                        reports the answer in a chunk ``permission answer: <json>``.
  ``[stderr=N:B]``      writes one line of B bytes to stderr, then N more lines of 100 bytes.
  ``[utf8]``            writes a line that is not valid UTF-8 (an update for the session),
                        then carries on normally.
  ``[close-stdout]``    closes its stdout, ignores SIGTERM and keeps running.

Everything the agent notes for itself goes to stderr (which the gateway only logs).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import sys
import time
import uuid

OUT = sys.stdout.buffer
ARGS = set(sys.argv[1:])
CONTROLS = ("session/set_mode", "session/set_model", "session/set_config_option")
backlog: collections.deque = collections.deque()
next_id = 1_000_000  # ids of this agent's own requests
garbage_now = "--garbage-always" in ARGS

GARBAGE = [
    "this is not json",
    "{broken",
    "[1, 2",
    "",
    "   ",
    "null",
    "42",
    '"a string"',
    "[]",
    "[{\"jsonrpc\":\"2.0\",\"method\":\"session/update\"}]",
    '{"jsonrpc":"2.0"}',
    '{"jsonrpc":"2.0","id":{},"result":1}',
    '{"jsonrpc":"2.0","method":"session/update"}',
    '{"jsonrpc":"2.0","method":"session/update","params":[1]}',
    '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":7,"update":{}}}',
    '{"jsonrpc":"2.0","method":42}',
    '{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":{"x":[]}}}',
    "\u00e9\u00e8 \U0001F600 unicode garbage",
    "\x1b[31mANSI\x1b[0m",
]


def write_raw(data: bytes) -> None:
    OUT.write(data)
    OUT.flush()


def write_garbage() -> None:
    for line in GARBAGE:
        write_raw(line.encode() + b"\n")


def send(msg: dict) -> None:
    if garbage_now:
        write_garbage()
    write_raw(json.dumps(msg).encode() + b"\n")


def recv() -> dict | None:
    """The next message: from the backlog first, then stdin; None at EOF."""
    if backlog:
        return backlog.popleft()
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            print(f"misbehaving agent: unreadable input {line[:80]!r}", file=sys.stderr)


def ask(method: str, params: dict) -> dict:
    """Sends a request to the client and waits for its answer (other messages are kept)."""
    global next_id
    next_id += 1
    rid = next_id
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    kept = []
    while True:
        msg = recv()
        if msg is None:
            sys.exit(0)
        if msg.get("id") == rid and "method" not in msg:
            backlog.extend(kept)
            return msg
        kept.append(msg)


def update(sid, text: str) -> dict:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": sid,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        },
    }


def marker(text: str, name: str) -> str | None:
    m = re.search(r"\[" + re.escape(name) + r"(?:=([^\]]*))?\]", text)
    if not m:
        return None
    return m.group(1) or ""


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 2**64, 1.5, 1e300, rng.randrange(-(10**20), 10**20)])
    if kind == 3:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF)])) for _ in range(rng.randrange(12)))
    if kind == 4:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{rng.randrange(5)}": random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def fuzz_line(rng: random.Random) -> str:
    """A random line that is valid UTF-8, never names a real session, and never answers an id the
    gateway uses (its ids are small non-negative integers; these are huge, negative or not numbers)."""
    foreign_ids = ["fuzz-id", -5, 2**70, 1.25, None, True, {"a": 1}, [1], 10**12 + rng.randrange(10**6)]
    kind = rng.randrange(8)
    if kind == 0:
        return "".join(chr(rng.randrange(32, 0xD7FF)) for _ in range(rng.randrange(200)))
    if kind == 1:
        return json.dumps(random_json(rng))
    if kind == 2:
        return json.dumps({"jsonrpc": "2.0", "id": rng.choice(foreign_ids), "result": random_json(rng)})
    if kind == 3:
        return json.dumps({"jsonrpc": "2.0", "id": rng.choice(foreign_ids), "error": random_json(rng)})
    if kind == 4:
        return json.dumps(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": f"fuzz-{rng.randrange(99)}", "update": random_json(rng)}}
        )
    if kind == 5:
        return json.dumps({"jsonrpc": "2.0", "method": rng.choice(["x/y", "", "session/cancel", "$/cancel_request"]), "params": random_json(rng)})
    if kind == 6:
        # A request naming no real session: the gateway answers it with an error.
        return json.dumps(
            {"jsonrpc": "2.0", "id": rng.choice(foreign_ids[:4]), "method": rng.choice(["fs/read_text_file", "session/request_permission", "x"]), "params": {"sessionId": "fuzz-nope"}}
        )
    text = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "fuzz-x", "update": random_json(rng)}})
    return text[: rng.randrange(len(text) + 1)]


def prompt(mid, params: dict) -> None:
    global garbage_now
    sid = params.get("sessionId")
    text = " ".join(b.get("text", "") for b in params.get("prompt", []) if isinstance(b, dict))
    chunks = int(marker(text, "chunks") or 3)
    was_garbage = garbage_now
    if marker(text, "garbage") is not None:
        garbage_now = True
    try:
        fuzz = marker(text, "fuzz")
        if fuzz:
            n, seed = fuzz.split(":")
            rng = random.Random(int(seed))
            for _ in range(int(n)):
                write_raw(fuzz_line(rng).encode() + b"\n")
        huge = marker(text, "huge-update")
        if huge:
            msg = update(sid, "")
            msg["params"]["update"]["content"]["text"] = "h" * int(huge)
            send(msg)
        noise = marker(text, "stderr")
        if noise:
            n, b = noise.split(":")
            sys.stderr.write("e" * int(b) + "\n")
            for i in range(int(n)):
                sys.stderr.write(f"{i:08} " + "n" * 91 + "\n")
            sys.stderr.flush()
        if marker(text, "utf8") is not None:
            line = json.dumps(update(sid, "BAD")).encode().replace(b"BAD", b"\xff\xfe\xc3(")
            write_raw(line + b"\n")
        if marker(text, "unknown-ids") is not None:
            for rid in [987654, "not-an-id", -1, 1.5, 2**70, "0", None, {"x": 1}, [0]]:
                send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
            send({"jsonrpc": "2.0", "id": 987655, "error": {"code": -32000, "message": "nobody asked"}})
        if marker(text, "foreign-session") is not None:
            for bad in ["no-such-session", "", None, 17, {"a": 1}]:
                send(update(bad, "for nobody"))
            send({"jsonrpc": "2.0", "method": "session/update", "params": {"update": {"sessionUpdate": "plan", "entries": []}}})
            answer = ask(
                "session/request_permission",
                {"sessionId": "no-such-session", "toolCall": {"toolCallId": "t1"}, "options": []},
            )
            send(update(sid, "foreign answer: " + json.dumps(answer, sort_keys=True)))
        if marker(text, "permission") is not None:
            answer = ask(
                "session/request_permission",
                {
                    "sessionId": sid,
                    "toolCall": {"toolCallId": "t1", "title": "write it"},
                    "options": [
                        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            )
            send(update(sid, "permission answer: " + json.dumps(answer.get("result", answer.get("error")), sort_keys=True)))
        if marker(text, "close-stdout") is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            OUT.close()
            os.close(1)
            print("misbehaving agent: stdout closed, still running", file=sys.stderr, flush=True)
            while sys.stdin.buffer.readline():
                pass
            while True:
                time.sleep(3600)
        for i in range(1, chunks + 1):
            send(update(sid, f"chunk {i}/{chunks}: {text}"))
        result = {"stopReason": "end_turn"}
        huge = marker(text, "huge-answer")
        if huge:
            result["_meta"] = {"pad": "p" * int(huge)}
        send({"jsonrpc": "2.0", "id": mid, "result": result})
        if marker(text, "unknown-ids") is not None:
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "refusal"}})
    finally:
        garbage_now = was_garbage


def main() -> None:
    if "--exit-at-start" in ARGS:
        print("misbehaving agent: exiting at start", file=sys.stderr, flush=True)
        sys.exit(3)
    if "--mute-init" in ARGS:
        while sys.stdin.buffer.readline():
            pass
        return
    while True:
        msg = recv()
        if msg is None:
            return
        if not isinstance(msg, dict):
            continue
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None or "id" not in msg:
            continue  # notifications (session/cancel, $/cancel_request) and stray answers
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}}},
                "authMethods": [],
                "agentInfo": {"name": "misbehaving-agent", "version": "1"},
            }
        elif method == "session/new":
            result = {"sessionId": f"bad-{uuid.uuid4().hex}"}
        elif method in ("session/load", "session/resume", "session/close"):
            result = {}
        elif method == "session/prompt":
            prompt(mid, params)
            continue
        elif method in CONTROLS and "--mute-controls" in ARGS:
            continue
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
