#!/usr/bin/env python3
"""A hostile agent for the web UI's browser test (tests/ui/hostile.test.mjs): a small ACP v1 stdio
agent (standard library only, JSON lines) whose every string the UI may render carries payloads
that try to run script, load remote or same-origin resources, restyle or clobber the page.

Channels: the agent's name and title (``initialize``, shown in the agent picker), ``session/new``'s
``modes`` and ``configOptions``; ``available_commands_update``, ``current_mode_update``,
``config_option_update``, ``session_info_update`` (title), ``usage_update`` (cost currency), a
``plan``; ``user_message_chunk``, ``agent_thought_chunk`` and ``agent_message_chunk`` text (Markdown
and raw HTML, streamed in pieces that cut tags in half), image / resource_link / resource content
blocks, Markdown nested past the parser's recursion limit, wrong JSON types in every structured field; ``tool_call`` / ``tool_call_update`` title, kind, status, rawInput, rawOutput, locations,
``diff`` content (path, oldText, newText), text content with ANSI escapes and OSC 8 hyperlinks,
``terminal`` content; a ``session/request_permission`` whose tool call and option names carry HTML;
folders with HTML names and a file of payloads in the session's cwd (the folder picker and the file
viewer show them), with a tool call location pointing at the file.

Every payload that would execute does something the test observes: sets ``window.__pwned``, asks
for ``/pwned?<tag>`` (the test routes ``**/pwned*``) and calls ``alert`` (the test watches
dialogs). Payloads that load a resource name ``/pwned?<tag>``, ``https://example.invalid/<tag>`` or
``/auth/login?code=<tag>`` (an image must not be able to spend a login code).

Each prompt streams all of it, asks the permission, then sends a last agent message with
``END_MARKER``: once that is on screen, everything before it has been rendered.

With ``HOSTILE_REQUIRE_AUTH=1`` it refuses ``session/new`` (``-32000``, a hostile message) until
``authenticate``, so that the UI shows its hostile auth methods.

Capabilities: ``loadSession`` (the gateway replays its stored transcript).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import uuid

END_MARKER = "HOSTILE-END-MARKER"


def js(tag: str) -> str:
    """Script that makes an execution observable three ways. Single quotes only, so that it fits in
    a double-quoted attribute and in a Markdown link destination."""
    return f"window.__pwned='{tag}';fetch('/pwned?{tag}');alert('{tag}')"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def html_payloads(tag: str) -> str:
    """Raw HTML that a sanitizer must defuse; one per line, so Markdown passes it through as HTML."""
    t = tag
    lines = [
        f'<script>{js(t + "-script")}</script>',
        f'<script src="/pwned?{t}-script-src"></script>',
        f'<img src=x onerror="{js(t + "-img-onerror")}">',
        f'<img src="x" alt="a" onload="{js(t + "-img-onload")}">',
        f'<img src="/auth/login?code={t}-html-img" alt="login">',
        f'<iframe srcdoc="<script>parent.{js(t + "-srcdoc")}</script>"></iframe>',
        f'<iframe src="/pwned?{t}-iframe"></iframe>',
        f'<object data="/pwned?{t}-object"></object>',
        f'<embed src="/pwned?{t}-embed">',
        f'<a href="javascript:{js(t + "-html-a")}">raw html javascript link</a>',
        f'<a href="jav&#x09;ascript:{js(t + "-html-a-tab")}">entity tab javascript link</a>',
        f'<a href="&#106;avascript:{js(t + "-html-a-entity")}">entity javascript link</a>',
        f'<a href="  JAVASCRIPT:{js(t + "-html-a-upper")}">upper javascript link</a>',
        f'<a href="https://example.invalid/{t}-a-self" target="_self">target self link</a>',
        f'<a href="https://example.invalid/{t}-a-onclick" onclick="{js(t + "-a-onclick")}">onclick link</a>',
        f'<form action="/pwned?{t}-form" method="post"><input name="q" value="x">'
        f'<button formaction="javascript:{js(t + "-formaction")}">form submit</button></form>',
        f'<style>body {{ background: url(/pwned?{t}-style) }} * {{ display: none }}</style>',
        f'<meta http-equiv="refresh" content="0;url=/pwned?{t}-meta">',
        f'<base href="https://example.invalid/{t}-base/">',
        f'<link rel="stylesheet" href="/pwned?{t}-link.css">',
        f'<details open ontoggle="{js(t + "-details")}"><summary>details ontoggle</summary>body</details>',
        f'<svg onload="{js(t + "-svg-onload")}"><script>{js(t + "-svg-script")}</script></svg>',
        f'<svg><a xlink:href="javascript:{js(t + "-svg-a")}"><text x="0" y="15">svg link</text></a></svg>',
        f'<svg><animate attributeName="href" values="javascript:{js(t + "-svg-animate")}"/></svg>',
        f'<svg><use href="data:image/svg+xml;base64,{b64("<svg id=x xmlns=%22http://www.w3.org/2000/svg%22><image href=1 onerror=alert(1) /></svg>")}#x"/></svg>',
        f'<math><mtext><table><mglyph><style><img src=x onerror="{js(t + "-mxss1")}"></style></mglyph></table></mtext></math>',
        f'<form><math><mtext></form><form><mglyph><style></math><img src onerror="{js(t + "-mxss2")}">',
        f'<noscript><p title="</noscript><img src=x onerror={js(t + "-mxss3").replace(" ", "")}>">',
        f'<svg></p><style><a id="</style><img src=1 onerror={js(t + "-mxss4").replace(" ", "")}>">',
        f'<math><mi><table><mi><mglyph><svg><mtext><textarea><path id="</textarea><img onerror="{js(t + "-mxss5")}" src=1>"></path></textarea></mtext></svg></mglyph></mi></table></mi></math>',
        f'<input autofocus onfocus="{js(t + "-autofocus")}">',
        f'<video><source onerror="{js(t + "-video")}"></video>',
        f'<template><script>{js(t + "-template")}</script></template>',
        f'<div style="position:fixed;inset:0;background:url(/pwned?{t}-style-attr)">style attribute</div>',
        f'<p id="prompt-input" name="composer">id clobbering</p><img name="getElementById"><form id="{t}-clobber"></form>',
        f'<div data-testid="permission-option" class="permission-option kind-allow_once">spoofed button</div>',
    ]
    return "\n".join(lines)


def markdown_payloads(tag: str) -> str:
    """Markdown (CommonMark + GFM) whose links, images, code and tables carry the payloads."""
    t = tag
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" onload="{js(t + "-md-svg")}"><script>{js(t + "-md-svg2")}</script></svg>'
    return "\n".join([
        f"# Hostile heading {t} <img src=x onerror=\"{js(t + '-heading')}\">",
        "",
        f"[markdown javascript link](javascript:{js(t + '-md-js')})",
        f"[mixed case link](JaVaScRiPt:{js(t + '-md-case')})",
        f"[newline link](java\nscript:{js(t + '-md-nl')})",
        f"[tab link](java\tscript:{js(t + '-md-tab')})",
        f"[entity link](javascript&#58;{js(t + '-md-entity')})",
        f"[entity link 2](&#106;avascript:{js(t + '-md-entity2')})",
        f"[angle link](<javascript:{js(t + '-md-angle')}>)",
        f"[vbscript link](vbscript:msgbox('{t}-vbs'))",
        f"[data link](data:text/html;base64,{b64('<script>' + js(t + '-md-data') + '</script>')})",
        f"[data link 2](<data:text/html,<script>{js(t + '-md-data2')}</script>>)",
        f"[reference link][evil-{t}]",
        f"[safe link](https://example.invalid/{t}-safe \"a title\")",
        "",
        f"[evil-{t}]: javascript:{js(t + '-md-ref')}",
        "",
        f"Autolinks: <javascript:{js(t + '-autolink')}> <https://example.invalid/{t}-autolink> "
        f"www.example.invalid/{t}-gfm-autolink and <mailto:someone@example.invalid>",
        "",
        f"![remote image](https://example.invalid/{t}-remote.png)",
        f"![javascript image](javascript:{js(t + '-md-img-js')})",
        f"![login image](/auth/login?code={t}-md-img)",
        f"![protocol-relative image](//example.invalid/{t}-md-img2.png)",
        f"[protocol-relative link](//example.invalid/{t}-md-link2)",
        f"![svg image](data:image/svg+xml;base64,{b64(svg)})",
        "",
        f"```\"><img src=x onerror=\"{js(t + '-info')}\">",
        f"code under a hostile info string {t}</code></pre><img src=x onerror=\"{js(t + '-code')}\">",
        "```",
        "",
        "```__proto__",
        "prototype info string",
        "```",
        "",
        "```constructor",
        "constructor info string",
        "```",
        "",
        "```no-such-language",
        f"fn main() {{ println!(\"<script>{js(t + '-code2')}</script>\"); }}",
        "```",
        "",
        "```html",
        f"<script>{js(t + '-code-html')}</script>",
        "```",
        "",
        "| cell | html |",
        "|---|---|",
        f"| <img src=x onerror=\"{js(t + '-cell-img')}\"> | [cell link](javascript:{js(t + '-cell-link')}) |",
        f"| <script>{js(t + '-cell-script')}</script> | <a href=\"javascript:{js(t + '-cell-a')}\">a</a> |",
        "",
        f"- [x] task <img src=x onerror=\"{js(t + '-task')}\">",
        f"- [ ] task <svg onload=\"{js(t + '-task-svg')}\"></svg>",
        "",
        html_payloads(t),
        "",
        f"Inline `<script>{js(t + '-inline-code')}</script>` and **bold <b onmouseover=\"{js(t + '-bold')}\">x</b>**.",
        "",
    ])


ANSI_OSC8 = (
    "\x1b[31mred\x1b[0m \x1b[1;32mbold green\x1b[0m "
    "\x1b]8;;javascript:{js}\x1b\\osc8 javascript link\x1b]8;;\x1b\\ "
    "\x1b]8;;https://example.invalid/osc8\x07osc8 bel link\x1b]8;;\x07 "
    "\x1b[38;2;255;0;0mtrue colour\x1b[0m \x1b]0;<img src=x onerror=\"{js}\">\x07title "
    "https://example.invalid/\"onmouseover=\"{js}\" "
)


def ansi_payload(tag: str) -> str:
    return ANSI_OSC8.format(js=js(tag)) + "\n" + html_payloads(tag + "-ansi")


def hostile(tag: str) -> str:
    """A short hostile string for names, titles, kinds and other one-line fields."""
    return f'<img src=x onerror="{js(tag)}"><script>{js(tag + "-s")}</script>[l](javascript:{js(tag + "-l")})'


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def update(sid: str, body: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": body}})


def text_chunk(sid: str, kind: str, text: str) -> None:
    update(sid, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


def pieces(text: str, size: int) -> list[str]:
    """Cuts text in pieces of `size` characters: a renderer that works on partial text sees tags,
    entities and link destinations cut in half."""
    return [text[i:i + size] for i in range(0, len(text), size)]


def modes() -> dict:
    return {
        "currentModeId": "ask",
        "availableModes": [
            {"id": "ask", "name": hostile("mode-name"), "description": hostile("mode-desc")},
            {"id": "<img src=x onerror=alert(1)>", "name": "code <b>bold</b>", "description": None},
        ],
    }


def config_options() -> list:
    return [
        {
            "id": "model",
            "name": hostile("config-name"),
            "description": hostile("config-desc"),
            "category": "model",
            "type": "select",
            "currentValue": "m1",
            "options": [
                {"value": "m1", "name": hostile("config-option"), "description": hostile("config-option-desc")},
                {"value": "\"><img src=x onerror=alert(1)>", "name": "<script>alert(1)</script>"},
            ],
        },
        {
            "id": "effort",
            "name": "effort <svg onload=alert(1)>",
            "category": "<img src=x onerror=alert(1)>",
            "type": "select",
            "currentValue": "g1",
            "options": [
                {"group": "g", "name": hostile("config-group"), "options": [
                    {"value": "g1", "name": hostile("config-grouped-option")},
                ]},
            ],
        },
        {"id": "flag", "name": hostile("config-bool"), "type": "boolean", "currentValue": True},
    ]


def tool_call(tool_id: str, tag: str, kind: str, status: str) -> dict:
    return {
        "toolCallId": tool_id,
        "title": hostile(tag + "-title"),
        "kind": kind,
        "status": status,
        "locations": [
            {"path": f'/ws/<img src=x onerror="{js(tag + "-loc")}">.rs', "line": 7},
            {"path": f"javascript:{js(tag + '-loc-js')}", "line": 1},
            {"path": "\"><svg onload=alert(1)>", "line": "<b>x</b>"},
        ],
        "rawInput": {"command": hostile(tag + "-raw-input"), "path": "<script>alert(1)</script>"},
    }


# Names the agent gives folders and a file in its cwd (the user's workspace), which the web UI's
# folder picker and file viewer show. No "/" (a path separator), so no js() payloads here.
HOSTILE_NAMES = ["<img src=x onerror=alert(1)>", "javascript:alert(1)", "\"><svg onload=alert(1)>"]
HOSTILE_FILE = "hostile <img src=x onerror=alert(1)>.html"


def plant(cwd: str) -> str | None:
    """Creates the hostile folders and file in `cwd`; returns the file's path (None when cwd is unusable)."""
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
        return None
    for name in HOSTILE_NAMES:
        os.makedirs(os.path.join(cwd, name), exist_ok=True)
    path = os.path.join(cwd, HOSTILE_FILE)
    with open(path, "w") as f:
        f.write(html_payloads("file") + "\n" + ansi_payload("file-ansi") + "\n")
    return path


def stream(sid: str, cwd: str | None, ask) -> None:
    """One hostile turn."""
    hostile_file = plant(cwd)
    text_chunk(sid, "user_message_chunk", "user chunk " + markdown_payloads("user"))
    for piece in pieces("thinking " + markdown_payloads("thought"), 97):
        text_chunk(sid, "agent_thought_chunk", piece)
    update(sid, {"sessionUpdate": "plan", "entries": [
        {"content": hostile("plan-1"), "priority": "high", "status": "completed"},
        {"content": markdown_payloads("plan-2")[:400], "priority": "<img src=x onerror=alert(1)>",
         "status": "\"><script>alert(1)</script>"},
    ]})
    for piece in pieces(markdown_payloads("agent"), 29):
        text_chunk(sid, "agent_message_chunk", piece)

    # Markdown nested deeper than the parser's recursion can go (marked throws "Maximum call stack
    # size exceeded"): this message must not take the rest of the conversation down with it.
    update(sid, {"sessionUpdate": "tool_call", "toolCallId": "tool-sep", "title": "separator", "kind": "think",
                 "status": "completed"})
    text_chunk(sid, "agent_message_chunk", "deep quote " + ">" * 5000 + " bottom\n\n" + "- " * 3000 + "deep list\n")

    # Tool calls: hostile strings in every field, and hostile values where an enum is expected.
    update(sid, {"sessionUpdate": "tool_call", **tool_call("tool-edit", "edit", "edit", "pending")})
    update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "tool-edit", "status": "completed",
                 "content": [{"type": "diff",
                              "path": f'/ws/<img src=x onerror="{js("diff-path")}">.rs',
                              "oldText": "fn old() {}\n" + html_payloads("diff-old") + "\n",
                              "newText": "fn new() {}\n" + html_payloads("diff-new") + "\n" + ansi_payload("diff-ansi") + "\n"},
                             {"type": "diff", "path": "javascript:alert(1)", "oldText": None,
                              "newText": markdown_payloads("diff-md")}],
                 "rawOutput": {"ok": hostile("raw-output")}})
    update(sid, {"sessionUpdate": "tool_call", **tool_call("tool-exec", "exec", "execute", "in_progress"),
                 "content": [{"type": "content", "content": {"type": "text", "text": ansi_payload("exec-text")}},
                             {"type": "terminal", "terminalId": hostile("terminal-id")}]})
    # claude-code-acp's convention for live command output, which the UI also shows.
    update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "tool-exec",
                 "_meta": {"terminal_output": {"terminal_id": hostile("meta-terminal-id"), "data": ansi_payload("meta-terminal")},
                           "terminal_exit": {"exit_code": hostile("meta-exit-code"), "signal": {"x": "<b>x</b>"}}}})
    update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "tool-exec", "status": "failed",
                 "content": [{"type": "content", "content": {"type": "text", "text": ansi_payload("exec-fail")}},
                             {"type": "content", "content": {"type": "text", "text": markdown_payloads("exec-md")}}]})
    update(sid, {"sessionUpdate": "tool_call", **tool_call("tool-odd", "odd",
                 "<img src=x onerror=alert(1)> edit", "<script>alert(1)</script>"),
                 "content": [{"type": "<img src=x onerror=alert(1)>", "weird": hostile("odd-content")}]})
    if hostile_file:
        update(sid, {"sessionUpdate": "tool_call", "toolCallId": "tool-file", "title": "Read a hostile file",
                     "kind": "read", "status": "completed", "locations": [{"path": hostile_file, "line": 3}]})
    update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "\"><img src=x onerror=alert(1)>",
                 "title": hostile("orphan-update"), "status": "completed"})

    # Session-level updates.
    update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": [
        {"name": hostile("cmd-name"), "description": hostile("cmd-desc"), "input": {"hint": hostile("cmd-hint")}},
        {"name": "explain", "description": "<b>bold</b> <a href=\"javascript:alert(1)\">x</a>"},
    ]})
    update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": "<img src=x onerror=alert(1)>"})
    update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": "ask"})
    update(sid, {"sessionUpdate": "config_option_update", "configOptions": config_options()})
    update(sid, {"sessionUpdate": "session_info_update", "title": hostile("session-title")})
    update(sid, {"sessionUpdate": "usage_update", "used": 1234, "size": 200000,
                 "cost": {"amount": 0.25, "currency": hostile("currency")}})

    # Wrong types where the schema has numbers, arrays and objects: a sloppy or hostile agent.
    for body in [
        {"sessionUpdate": "usage_update", "used": "<img src=x onerror=alert(1)>", "size": None,
         "cost": {"amount": "<b>x</b>", "currency": {"html": "<script>alert(1)</script>"}}},
        {"sessionUpdate": "usage_update", "used": -5, "size": 0, "cost": None},
        {"sessionUpdate": "plan", "entries": "<img src=x onerror=alert(1)>"},
        {"sessionUpdate": "plan", "entries": [None, 7, {"content": ["<b>x</b>"], "status": {}, "priority": []}]},
        {"sessionUpdate": "available_commands_update", "availableCommands": [None, {"name": 5}, {"name": "ok", "description": ["x"], "input": "hint"}]},
        {"sessionUpdate": "available_commands_update", "availableCommands": "<img src=x onerror=alert(1)>"},
        {"sessionUpdate": "current_mode_update", "currentModeId": {"id": "<img src=x onerror=alert(1)>"}},
        {"sessionUpdate": "config_option_update", "configOptions": [None, {"id": 1, "type": "select", "options": "x"},
                                                                      {"id": "model", "name": None, "type": "select", "currentValue": {}, "options": [None, {"value": []}]}]},
        {"sessionUpdate": "config_option_update", "configOptions": config_options()},
        {"sessionUpdate": "session_info_update", "title": ["<img src=x onerror=alert(1)>"]},
        {"sessionUpdate": "session_info_update", "title": hostile("session-title")},
        {"sessionUpdate": "tool_call", "toolCallId": "tool-types", "title": 42, "kind": ["edit"], "status": None,
         "locations": [None, {"path": 5, "line": "x"}, "<img src=x onerror=alert(1)>"],
         "content": [None, "text", {"type": "diff", "path": None, "oldText": 5, "newText": {"x": 1}},
                     {"type": "content", "content": None}, {"type": "content", "content": {"type": "text", "text": None}}],
         "rawInput": "<img src=x onerror=alert(1)>"},
        {"sessionUpdate": "tool_call_update", "toolCallId": "tool-types", "content": "not a list", "locations": {}},
        {"sessionUpdate": "agent_message_chunk", "content": None},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": {"html": "<script>alert(1)</script>"}}},
        {"sessionUpdate": "agent_thought_chunk", "content": "<img src=x onerror=alert(1)>"},
        {"sessionUpdate": "<img src=x onerror=alert(1)>", "payload": hostile("unknown-update")},
        {"sessionUpdate": None},
    ]:
        update(sid, body)
    update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": [
        {"name": hostile("cmd-name"), "description": hostile("cmd-desc"), "input": {"hint": hostile("cmd-hint")}},
        {"name": "explain", "description": "<b>bold</b> <a href=\"javascript:alert(1)\">x</a>", "input": {"hint": hostile("cmd-hint")}},
    ]})

    # Content blocks other than text.
    for block in [
        {"type": "image", "mimeType": "text/html", "data": b64("<script>" + js("image-html") + "</script>")},
        {"type": "image", "mimeType": "image/svg+xml",
         "data": b64(f'<svg xmlns="http://www.w3.org/2000/svg" onload="{js("image-svg")}"><script>{js("image-svg2")}</script></svg>')},
        {"type": "image", "mimeType": 'image/png;base64,AAAA" onerror="' + js("image-mime"), "data": "AAAA"},
        {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo=", "uri": f"javascript:{js('image-uri')}"},
        {"type": "resource_link", "uri": f"javascript:{js('resource-link')}", "name": hostile("resource-link-name"),
         "title": hostile("resource-link-title"), "description": hostile("resource-link-desc"), "mimeType": "text/html"},
        {"type": "resource_link", "uri": f"data:text/html,<script>{js('resource-link-data')}</script>", "name": "data link"},
        {"type": "resource_link", "uri": "https://example.invalid/resource\"onmouseover=\"alert(1)", "name": "quoted uri"},
        {"type": "resource", "resource": {"uri": f"javascript:{js('resource')}", "mimeType": "text/html",
                                          "text": html_payloads("resource-text")}},
        {"type": "resource", "resource": {"uri": "file:///etc/passwd", "mimeType": "text/html",
                                          "blob": b64("<script>" + js("resource-blob") + "</script>")}},
        {"type": "audio", "mimeType": "text/html", "data": b64("<script>alert(1)</script>")},
    ]:
        update(sid, {"sessionUpdate": "agent_message_chunk", "content": block})

    # Permission requests with wrong types: the user must still be able to answer them.
    malformed = [
        ask({"sessionId": sid, "toolCall": None, "options": hostile("perm-options-string")}),
        ask({"sessionId": sid, "toolCall": {"toolCallId": ["x"], "title": {"t": "<b>x</b>"}},
             "options": [None, 5, "<img src=x onerror=alert(1)>",
                         {"optionId": "allow", "name": {"html": "<b>x</b>"}, "kind": ["allow_once"]}]}),
    ]
    outcome = ask({
        "sessionId": sid,
        "toolCall": {**tool_call("tool-perm", "perm", "edit", "pending"),
                     "content": [{"type": "diff", "path": hostile("perm-diff-path"), "oldText": "a",
                                  "newText": html_payloads("perm-diff")}]},
        "options": [
            {"optionId": "allow", "name": hostile("perm-allow"), "kind": "allow_once"},
            {"optionId": "\"><img src=x onerror=alert(1)>", "name": "<b>reject</b>",
             "kind": "reject_once\" onmouseover=\"alert(1)"},
        ],
    })
    text_chunk(sid, "agent_message_chunk",
               f"\n\npermission outcomes: {json.dumps(malformed)} {json.dumps(outcome)}\n\n{END_MARKER}\n")


class Agent:
    def __init__(self) -> None:
        self.next_id = 1
        # With HOSTILE_REQUIRE_AUTH=1, session/new is refused (-32000, with a hostile message)
        # until `authenticate`: the web UI then shows the agent's auth methods.
        self.authed = os.environ.get("HOSTILE_REQUIRE_AUTH") != "1"
        self.cwds = {}  # session id → cwd

    def read(self):
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def ask(self, params: dict):
        """Sends session/request_permission and answers other requests until its response comes."""
        rid = f"perm-{self.next_id}"
        self.next_id += 1
        send({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": params})
        while True:
            msg = self.read()
            if not isinstance(msg, dict):
                continue
            if msg.get("id") == rid and "method" not in msg:
                return msg.get("result", msg.get("error"))
            self.handle(msg)

    def handle(self, msg: dict) -> None:
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if mid is None or method is None:
            return  # notifications (session/cancel) and stray responses
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True},
                "authMethods": [{"id": "hostile", "name": hostile("auth-name"), "description": hostile("auth-desc")}],
                "agentInfo": {"name": "hostile <img src=x onerror=alert(1)>", "title": hostile("agent-title"),
                              "version": "<script>alert(1)</script>"},
            }
        elif method == "session/new" and not self.authed:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": hostile("auth-error"),
                                                          "data": {"html": hostile("auth-error-data")}}})
            return
        elif method == "session/new":
            sid = f"hostile-{uuid.uuid4().hex}"
            self.cwds[sid] = params.get("cwd")
            result = {"sessionId": sid, "modes": modes(), "configOptions": config_options()}
        elif method in ("session/load", "session/resume"):
            self.cwds[params.get("sessionId")] = params.get("cwd")
            result = {"modes": modes(), "configOptions": config_options()}
        elif method == "session/set_mode":
            update(params.get("sessionId"), {"sessionUpdate": "current_mode_update",
                                             "currentModeId": params.get("modeId")})
            result = {}
        elif method == "session/set_config_option":
            result = {"configOptions": config_options()}
        elif method == "session/prompt":
            stream(params.get("sessionId"), self.cwds.get(params.get("sessionId")), self.ask)
            result = {"stopReason": "end_turn"}
        elif method == "authenticate":
            self.authed = True
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown {method}"}})
            return
        send({"jsonrpc": "2.0", "id": mid, "result": result})

    def run(self) -> None:
        while True:
            msg = self.read()
            if isinstance(msg, dict):
                self.handle(msg)


if __name__ == "__main__":
    Agent().run()
