#!/usr/bin/env python3
"""ACP client over WebSocket built on the official Python SDK.

Uses the ``agent-client-protocol`` package's own client-side connection
(``acp.connect_to_agent`` -> ``ClientSideConnection``) on top of the SDK's
WebSocket transport (``acp.ws.create_websocket_stream``, which needs the
``websockets`` package, i.e. the SDK's ``[http]`` extra; see requirements.txt).

    python3 sdk_ws_client.py --url ws://127.0.0.1:PORT/acp --token JWT --prompt "hello"

Flow: initialize -> session/new {cwd, mcpServers: []} -> session/prompt.

stdout (machine-readable, one JSON document per line):
  UPDATE <json>   every session/update received, as {"sessionId":..., "update":{...}}
  RESULT <json>   the session/prompt response, e.g. {"stopReason":"end_turn"}
  ERROR <json>    on failure (see exit codes)
stderr: human-readable progress (initialize/session results, permission decisions).

Permission requests (session/request_permission) are answered by selecting the
first option whose kind starts with "allow" (``cancelled`` if there is none).

Exit codes: 0 ok; 1 transport/other failure (incl. timeout); 2 JSON-RPC error
response; 3 WebSocket handshake rejected by HTTP status (e.g. 401/403).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.parse
from importlib.metadata import version as _pkg_version
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    RequestError,
    RequestPermissionResponse,
    SessionNotification,
    connect_to_agent,
    text_block,
)
from acp.schema import AllowedOutcome, ClientCapabilities, DeniedOutcome, Implementation
from acp.ws import create_websocket_stream  # needs `websockets` (SDK's [http] extra)
from websockets.exceptions import InvalidStatus


def _out(prefix: str, payload: Any) -> None:
    sys.stdout.write(f"{prefix} {json.dumps(payload, separators=(',', ':'))}\n")
    sys.stdout.flush()


def _err(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class PrintingClient:
    """Structural implementation of the SDK's ``acp.Client`` protocol.

    Not a subclass of ``acp.Client`` (a ``typing.Protocol``) so that methods we
    do not implement (fs/*, terminal/*) are answered with ``Method not found``
    by the SDK router instead of the protocol stubs' ``None``.
    """

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        notification = SessionNotification(session_id=session_id, update=update, field_meta=kwargs or None)
        _out("UPDATE", _dump(notification))

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        chosen = next((o for o in options if str(o.kind).startswith("allow")), None)
        _err(
            f"permission requested: toolCall={json.dumps(_dump(tool_call))} "
            f"options={[o.option_id + '/' + o.kind for o in options]} -> "
            f"{chosen.option_id if chosen else 'cancelled'}"
        )
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id))


def _bypass_proxy_for(url: str) -> None:
    """websockets' connect() defaults to proxy=True and honours http(s)_proxy /
    all_proxy env vars even for 127.0.0.1 unless no_proxy lists the host, and
    the SDK's create_websocket_stream() does not expose that knob. A test client
    must reach the gateway directly, so add the target host to no_proxy."""
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        return
    for var in ("no_proxy", "NO_PROXY"):
        entries = [e for e in os.environ.get(var, "").split(",") if e.strip()]
        if host not in entries:
            os.environ[var] = ",".join([*entries, host])


async def run(args: argparse.Namespace) -> int:
    headers: dict[str, str] = {}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"

    _bypass_proxy_for(args.url)
    try:
        transport = await create_websocket_stream(args.url, headers=headers or None)
    except InvalidStatus as exc:
        status = exc.response.status_code
        body = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
        _out("ERROR", {"handshakeStatus": status, "body": body})
        _err(f"websocket handshake rejected: HTTP {status}")
        return 3

    conn = connect_to_agent(PrintingClient(), transport)
    try:
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="sdk-ws-client", version=_pkg_version("agent-client-protocol")),
        )
        _err(f"initialize -> {json.dumps(_dump(init))}")

        session = await conn.new_session(cwd=args.cwd, mcp_servers=[])
        _err(f"session/new -> {json.dumps(_dump(session))}")

        result = await conn.prompt(session_id=session.session_id, prompt=[text_block(args.prompt)])
        _out("RESULT", _dump(result))
        return 0
    except RequestError as exc:
        _out("ERROR", exc.to_error_obj())
        _err(f"JSON-RPC error: {exc}")
        return 2
    finally:
        await conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description="ACP WebSocket client using the official agent-client-protocol Python SDK.",
        epilog="stdout lines: 'UPDATE <json>' per session/update, 'RESULT <json>' for the prompt "
        "response, 'ERROR <json>' on failure. Exit: 0 ok, 1 transport error/timeout, "
        "2 JSON-RPC error, 3 handshake rejected (HTTP status).",
    )
    ap.add_argument("--url", required=True, help="gateway WebSocket URL, e.g. ws://127.0.0.1:PORT/acp")
    ap.add_argument("--token", default=None, help="JWT sent as 'Authorization: Bearer <token>' on the upgrade")
    ap.add_argument("--prompt", default="hello", help="prompt text (default: %(default)s)")
    ap.add_argument("--cwd", default="/tmp", help="cwd for session/new (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=30.0, help="overall timeout in seconds (default: %(default)s)")
    args = ap.parse_args()

    try:
        return asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout))
    except asyncio.TimeoutError:
        _out("ERROR", {"timeout": args.timeout})
        _err(f"timed out after {args.timeout}s")
        return 1
    except (OSError, ConnectionError, Exception) as exc:  # refused, reset, closed mid-call, ...
        _out("ERROR", {"exception": type(exc).__name__, "message": str(exc)})
        _err(f"failed: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
