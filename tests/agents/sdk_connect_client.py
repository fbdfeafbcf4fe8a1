#!/usr/bin/env python3
"""The official Python SDK as an editor: it spawns ``acp-gateway connect`` as its stdio agent.

    python3 sdk_connect_client.py --gateway-bin PATH --url http://127.0.0.1:PORT --token JWT --cwd DIR

With ``--transport http`` it speaks to the gateway's ``/acp`` itself over Streamable HTTP (the
SDK's ``acp.http.create_http_stream``), the same flow with only the transport changed.

Flow: initialize -> session/list -> session/new -> session/prompt (streamed, with a permission,
answered "allow") -> session/list again (the new session listed) -> session/load (the transcript
replayed). stdout, one JSON document per line:
  INIT <json> | LIST <json> | UPDATE <json> | RESULT <json> | LOADED <json> (updates replayed)
  PERMISSION <json> (the options asked)
Exit 0 on success; 1 on any failure (with ERROR <text>).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from acp import PROTOCOL_VERSION, RequestPermissionResponse, spawn_agent_process, text_block
from acp.schema import AllowedOutcome, ClientCapabilities, DeniedOutcome, Implementation


def out(prefix: str, payload: Any) -> None:
    sys.stdout.write(f"{prefix} {json.dumps(payload, separators=(',', ':'))}\n")
    sys.stdout.flush()


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Editor:
    """What an editor does with what the agent sends."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(dump(update))
        out("UPDATE", {"sessionId": session_id, "update": dump(update)})

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        out("PERMISSION", [o.option_id for o in options])
        chosen = next((o for o in options if str(o.kind).startswith("allow")), None)
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id))


async def run(args: argparse.Namespace) -> int:
    editor = Editor()
    if args.transport == "http":
        from acp import connect_to_agent
        from acp.http import create_http_stream

        transport = create_http_stream(f"{args.url}/acp", headers={"Authorization": f"Bearer {args.token}"})
        conn = connect_to_agent(editor, transport)
        try:
            await flow(conn, editor, args)
        finally:
            await conn.close()
        return 0
    async with spawn_agent_process(
        editor, args.gateway_bin, "connect", args.url, "--token", args.token
    ) as (conn, _process):
        await flow(conn, editor, args)
    return 0


async def flow(conn: Any, editor: Editor, args: argparse.Namespace) -> None:
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="sdk-connect-client", version="1"),
    )
    out("INIT", dump(init))
    out("LIST", dump(await conn.list_sessions()))
    new = await conn.new_session(cwd=args.cwd, mcp_servers=[])
    result = await conn.prompt(session_id=new.session_id, prompt=[text_block("hello from the SDK [permission]")])
    out("RESULT", dump(result))
    out("LIST", dump(await conn.list_sessions()))
    editor.updates.clear()
    await conn.load_session(cwd=args.cwd, session_id=new.session_id, mcp_servers=[])
    out("LOADED", {"sessionId": new.session_id, "replayed": len(editor.updates)})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gateway-bin", default="")
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--cwd", required=True)
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--transport", choices=["connect", "http"], default="connect")
    args = p.parse_args()
    try:
        return asyncio.run(asyncio.wait_for(run(args), args.timeout))
    except Exception as exc:  # noqa: BLE001 - the test reads it
        out("ERROR", repr(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
