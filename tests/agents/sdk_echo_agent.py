#!/usr/bin/env python3
"""Minimal ACP v1 echo agent built on the official Python SDK.

Uses the third-party ``agent-client-protocol`` package (PyPI; see
requirements.txt for the pinned version). All JSON-RPC framing, request/response
correlation and (de)serialisation is done by the SDK (``acp.run_agent`` over
stdio), none of it is hand-written here. This lets the gateway's tests prove
interoperability with an ACP implementation we did not write.

Behaviour:
  * ``initialize``       -> SDK-default capabilities (loadSession false), protocol v1.
  * ``session/new``      -> fresh ``sdk-<uuid>`` session id.
  * ``session/prompt``   -> three ``agent_message_chunk`` updates
                            ``part i/3: sdk-echo: <prompt text>`` then ``end_turn``.
                            If the text contains ``[permission]`` the agent first
                            calls ``session/request_permission`` (options ``allow``
                            / allow_once and ``reject`` / reject_once) and every
                            chunk carries ``(allowed)`` or ``(rejected)``.
  * ``session/cancel``   -> accepted; an in-flight prompt stops and returns
                            ``cancelled``.

Optional env: ``SDK_ECHO_CHUNK_DELAY_MS`` (default 0) sleeps between chunks,
useful for exercising cancellation through the gateway.

Run: ``python3 tests/agents/sdk_echo_agent.py`` (speaks NDJSON on stdin/stdout;
diagnostics only ever go to stderr).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    update_agent_message_text,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    PermissionOption,
    ToolCallUpdate,
)

AGENT_NAME = "sdk-echo-agent"
AGENT_VERSION = "0.1.0"
PARTS = 3


def _prompt_text(prompt: list[Any]) -> str:
    """Concatenate the text of all text content blocks in a prompt."""
    texts = []
    for block in prompt:
        text = getattr(block, "text", None)
        if text is None and isinstance(block, dict):
            text = block.get("text")
        if isinstance(text, str):
            texts.append(text)
    return "".join(texts)


class SdkEchoAgent:
    """Echo agent; structurally implements the subset of the ``acp.Agent``
    protocol we need.

    Deliberately *not* a subclass of ``acp.Agent``: that is a ``typing.Protocol``
    whose stub methods would be inherited and picked up by the SDK router,
    answering e.g. ``session/load`` with ``null`` instead of an error. Methods
    not defined here (session/load, authenticate, ...) are answered by the SDK
    router with JSON-RPC ``Method not found``.
    """

    def __init__(self) -> None:
        self._conn: Client | None = None
        self._sessions: set[str] = set()
        self._cancelled: set[str] = set()
        self._delay = float(os.environ.get("SDK_ECHO_CHUNK_DELAY_MS", "0") or 0) / 1000.0

    # Called by AgentSideConnection with the client-side proxy we use for
    # session/update notifications and session/request_permission requests.
    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),  # SDK defaults: loadSession=false
            agent_info=Implementation(name=AGENT_NAME, title="SDK echo agent", version=AGENT_VERSION),
        )

    async def new_session(
        self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        session_id = f"sdk-{uuid.uuid4().hex}"
        self._sessions.add(session_id)
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        if session_id not in self._sessions:
            raise RequestError.invalid_params({"sessionId": session_id, "reason": "unknown session"})
        assert self._conn is not None
        self._cancelled.discard(session_id)
        text = _prompt_text(prompt)

        reply = f"sdk-echo: {text}"
        if "[permission]" in text:
            response = await self._conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(
                    tool_call_id=f"perm-{uuid.uuid4().hex[:8]}",
                    title="sdk-echo wants permission",
                    kind="other",
                    status="pending",
                ),
                options=[
                    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
                ],
            )
            outcome = response.outcome
            if isinstance(outcome, AllowedOutcome) and outcome.option_id == "allow":
                verdict = "allowed"
            else:  # selected "reject" (or unknown option) or outcome "cancelled"
                verdict = "rejected"
            reply = f"sdk-echo ({verdict}): {text}"
            if session_id in self._cancelled:
                return PromptResponse(stop_reason="cancelled")

        for i in range(1, PARTS + 1):
            if session_id in self._cancelled:
                return PromptResponse(stop_reason="cancelled")
            await self._conn.session_update(
                session_id=session_id,
                update=update_agent_message_text(f"part {i}/{PARTS}: {reply}"),
            )
            if self._delay and i < PARTS:
                await asyncio.sleep(self._delay)

        if session_id in self._cancelled:
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self._cancelled.add(session_id)


async def main() -> None:
    await run_agent(SdkEchoAgent())


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("SDK_ECHO_LOG", "WARNING"))
    asyncio.run(main())
