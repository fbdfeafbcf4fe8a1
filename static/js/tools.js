// Tool call cards for the conversation: one card per ACP `toolCallId`, by kind and status, with
// `diff` content as a unified (or side-by-side) diff, terminal output with ANSI colours, and
// locations that open a file viewer (GET /api/fs/file).
//
// Layout of this file:
//   1. helpers         — SVG icons, kinds and statuses
//   2. ToolCard        — merges `tool_call` / `tool_call_update` per ACP and renders the card
//
// `diff` content is drawn by tool-diff.js, terminal output (ANSI through anser) by terminal.js,
// the file viewer (a <dialog> showing one file at one line, and the links that open it) is
// file-viewer.js, and both it and the diffs highlight code line by line with highlight-lines.js.
//
// Everything an agent sends is untrusted: it reaches the DOM as text nodes, as CSSOM properties
// (`el.style.color`) or as element classes from a fixed list; never through innerHTML and never
// as a `style="..."` string (the page's CSP forbids inline styles anyway).

import { atEnd, el as h, isString } from './dom.js';
import { codeView, renderMarkdown } from './markdown.js';
import { contentBlock } from './content.js';
import { fileLink } from './file-viewer.js';
import { languageFor } from './highlight-lines.js';
import { renderDiff } from './tool-diff.js';
import { appendTerminal, hasAnsi, renderTerminal, TERMINAL_CHAR_CAP } from './terminal.js';

// ---------------------------------------------------------------------------------------------
// 1. Helpers

/**
 * What a card keeps of streamed output once it passes TERMINAL_CHAR_CAP: cutting back further
 * than the cap means the next 100,000 characters append to the block instead of each update
 * dropping a line at the top and rebuilding the whole block.
 */
const TERMINAL_CHAR_KEEP = 100_000;

const SVG_NS = 'http://www.w3.org/2000/svg';

/** A 24×24 stroked icon from path data; decorative (the label next to it carries the meaning). */
function icon(paths, className = 'tc-icon') {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('class', className);
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  for (const d of paths) {
    const path = document.createElementNS(SVG_NS, 'path');
    path.setAttribute('d', d);
    svg.append(path);
  }
  return svg;
}

const CIRCLE = (cx, cy, r) => `M${cx - r} ${cy}a${r} ${r} 0 1 0 ${2 * r} 0a${r} ${r} 0 1 0 ${-2 * r} 0z`;

/** ACP ToolKind → label and icon. Unknown kinds are `other` (the schema's `serde(other)`). */
const KINDS = {
  read: { label: 'Read', icon: ['M14 3H6a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h12a2 2 0 0 0 2-2V9z', 'M14 3v6h6', 'M8 13h8', 'M8 17h5'] },
  edit: { label: 'Edit', icon: ['M4 20h4L19 9l-4-4L4 16z', 'M13 7l4 4'] },
  delete: { label: 'Delete', icon: ['M4 7h16', 'M9 7V4h6v3', 'M6 7l1 13h10l1-13', 'M10 11v6', 'M14 11v6'] },
  move: { label: 'Move', icon: ['M4 12h15', 'M13 6l6 6-6 6'] },
  search: { label: 'Search', icon: [CIRCLE(11, 11, 7), 'M16 16l5 5'] },
  execute: { label: 'Run', icon: ['M3 5h18v14H3z', 'M7 9l3 3-3 3', 'M12 15h5'] },
  think: { label: 'Think', icon: ['M9 18h6', 'M10 21h4', 'M12 3a6 6 0 0 0-4 10.5c.7.7 1 1.5 1 2.5h6c0-1 .3-1.8 1-2.5A6 6 0 0 0 12 3z'] },
  fetch: { label: 'Fetch', icon: [CIRCLE(12, 12, 9), 'M3 12h18', 'M12 3c2.5 2.5 3.5 5.5 3.5 9s-1 6.5-3.5 9c-2.5-2.5-3.5-5.5-3.5-9s1-6.5 3.5-9z'] },
  switch_mode: { label: 'Switch mode', icon: ['M4 8h14', 'M14 4l4 4-4 4', 'M20 16H6', 'M10 12l-4 4 4 4'] },
  other: { label: 'Tool', icon: [CIRCLE(12, 12, 9), 'M8 12h.01', 'M12 12h.01', 'M16 12h.01'] },
};

/** ACP ToolCallStatus → label and icon (in_progress is a CSS spinner). */
const STATUSES = {
  pending: { label: 'Pending', icon: [CIRCLE(12, 12, 7)] },
  in_progress: { label: 'Running', icon: null },
  completed: { label: 'Done', icon: ['M5 12l5 5 9-10'] },
  failed: { label: 'Failed', icon: ['M6 6l12 12', 'M18 6L6 18'] },
};

function prettyJson(value, cap = 20_000) {
  let text;
  try {
    text = JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > cap ? `${text.slice(0, cap)}\n… (${text.length - cap} more characters)` : text;
}

// ---------------------------------------------------------------------------------------------
// 2. ToolCard

/** Card state fields a `tool_call_update` may replace (a missing or null field leaves them as they are). */
const FIELDS = ['title', 'kind', 'status', 'content', 'locations', 'rawInput', 'rawOutput'];

let cardSeq = 0;

/** The command of an `execute` tool call, from its rawInput (a string, an argv, or {command}). */
function commandOf(rawInput) {
  const cmd = rawInput && typeof rawInput === 'object' && !Array.isArray(rawInput) ? rawInput.command ?? rawInput.cmd : rawInput;
  if (isString(cmd)) return cmd;
  if (Array.isArray(cmd) && cmd.every(isString)) return cmd.join(' ');
  return null;
}

/** An exit code when rawOutput is just that ({exitCode} / {exit_code}, as agents report commands). */
function exitCodeOf(rawOutput) {
  if (!rawOutput || typeof rawOutput !== 'object' || Array.isArray(rawOutput)) return null;
  const keys = Object.keys(rawOutput);
  const code = rawOutput.exitCode ?? rawOutput.exit_code;
  return keys.length === 1 && Number.isInteger(code) ? code : null;
}

export class ToolCard {
  /** @param {string} id the toolCallId; @param {() => string} cwd the session's cwd, for relative paths */
  constructor(id, { cwd = () => '' } = {}) {
    this.id = id;
    this.cwd = cwd;
    this.state = { title: '', kind: 'other', status: 'pending', content: [], locations: [], rawInput: undefined, rawOutput: undefined };
    this.expanded = null; // null: follow the status; true/false once the user toggles
    this.terminalOut = ''; // `_meta.terminal_output` text (claude-code-acp's convention): its last TERMINAL_CHAR_CAP characters at most
    this.terminalClipped = 0; // characters dropped from the start of terminalOut
    this.terminalSeq = 0; // outputs appended to terminalOut: the render key, instead of the text itself
    this.terminalPre = null; // the block showing terminalOut, and how much of it
    this.terminalShown = 0;
    this.rendered = {};
    const bodyId = `tool-body-${++cardSeq}`;
    this.kindIcon = h('span', { class: 'tc-kind-icon' });
    this.kindLabel = h('span', { class: 'tc-kind', testid: 'tool-kind' });
    this.title = h('span', { class: 'tc-title', testid: 'tool-title' });
    this.statusEl = h('span', { class: 'tc-status', testid: 'tool-status' });
    this.chevron = icon(['M9 6l6 6-6 6'], 'tc-chevron');
    this.toggle = h('button', { type: 'button', class: 'tc-toggle', 'aria-expanded': 'false', 'aria-controls': bodyId },
      this.chevron, this.kindIcon, this.kindLabel, this.title, this.statusEl);
    this.toggle.addEventListener('click', () => {
      this.expanded = this.toggle.getAttribute('aria-expanded') !== 'true';
      this.#applyExpanded();
    });
    this.summary = h('div', { class: 'tc-summary' });
    this.contentEl = h('div', { class: 'tc-content' });
    this.rawEl = h('div', { class: 'tc-raw' });
    this.body = h('div', { class: 'tc-body', id: bodyId, hidden: true }, this.contentEl, this.rawEl);
    this.root = h('section', { class: 'tool tc-card', testid: 'tool-call', 'data-tool-call-id': id, 'data-status': 'pending', 'data-kind': 'other' },
      h('h3', { class: 'tc-heading' }, this.toggle), this.summary, this.body);
  }

  /** Applies a `tool_call` (every field, defaults for the missing ones) or a `tool_call_update`. */
  apply(update) {
    const full = update.sessionUpdate === 'tool_call';
    const next = { ...this.state };
    if (full) Object.assign(next, { kind: 'other', status: 'pending', content: [], locations: [] });
    for (const field of FIELDS) {
      if (update[field] !== undefined && update[field] !== null) next[field] = update[field];
    }
    if (!Array.isArray(next.content)) next.content = [];
    if (!Array.isArray(next.locations)) next.locations = [];
    if (!KINDS[next.kind]) next.kind = 'other';
    if (!STATUSES[next.status]) next.status = 'pending';
    const meta = update._meta;
    if (meta && typeof meta === 'object') {
      const out = meta.terminal_output?.data;
      if (isString(out) && out) this.#addTerminalOutput(out);
      const exit = meta.terminal_exit;
      if (exit && typeof exit === 'object') this.terminalExit = exit;
    }
    this.state = next;
    // One render for every update the conversation applies in one pass (a replay, or a command's
    // output streamed in many updates), once that pass is over.
    if (this.renderQueued) return;
    this.renderQueued = true;
    queueMicrotask(() => {
      this.renderQueued = false;
      this.#renderKeepingScroll();
    });
  }

  /**
   * Keeps the tail of the output: past TERMINAL_CHAR_CAP it drops the start (at a line break when
   * one is near) down to TERMINAL_CHAR_KEEP, so a long build log costs bounded memory and work.
   */
  #addTerminalOutput(out) {
    let text = this.terminalOut + out;
    if (text.length > TERMINAL_CHAR_CAP) {
      let cut = text.length - TERMINAL_CHAR_KEEP;
      const newline = text.indexOf('\n', cut);
      if (newline >= 0 && newline - cut < 4096) cut = newline + 1;
      this.terminalClipped += cut;
      text = text.slice(cut);
    }
    this.terminalOut = text;
    this.terminalSeq += 1;
  }

  /** Renders; a conversation scrolled to its end stays at its end as the card grows. */
  #renderKeepingScroll() {
    const log = this.root.closest('[role="log"]');
    const stick = atEnd(log);
    this.#render();
    if (stick) log.scrollTop = log.scrollHeight;
  }

  #render() {
    const s = this.state;
    const cwd = this.cwd() ?? '';
    const kind = KINDS[s.kind];
    const status = STATUSES[s.status];
    this.root.dataset.status = s.status;
    this.root.dataset.kind = s.kind;
    if (this.rendered.kind !== s.kind) {
      this.kindIcon.replaceChildren(icon(kind.icon));
      this.kindLabel.textContent = kind.label;
      this.rendered.kind = s.kind;
    }
    this.title.textContent = isString(s.title) && s.title ? s.title : kind.label;
    if (this.rendered.status !== s.status) {
      this.statusEl.replaceChildren(status.icon ? icon(status.icon, 'tc-status-icon') : h('span', { class: 'tc-spinner', 'aria-hidden': 'true' }),
        h('span', { class: 'tc-status-text', text: status.label }));
      this.statusEl.dataset.status = s.status;
      this.rendered.status = s.status;
    }

    // Always visible: the command of an execute call and the locations.
    const summaryKey = JSON.stringify([s.kind, s.rawInput === undefined ? null : commandOf(s.rawInput), s.locations, cwd]);
    if (this.rendered.summary !== summaryKey) {
      const parts = [];
      const command = s.kind === 'execute' ? commandOf(s.rawInput) : null;
      if (command) parts.push(h('pre', { class: 'tc-command', testid: 'tool-command' }, h('span', { class: 'tc-prompt', 'aria-hidden': 'true', text: '$ ' }), command));
      const locations = s.locations.filter((l) => l && isString(l.path) && l.path);
      if (locations.length) {
        parts.push(h('ul', { class: 'tc-locations', 'aria-label': 'Locations' },
          locations.slice(0, 50).map((l) => h('li', {}, fileLink(l.path, Number.isInteger(l.line) ? l.line : null, cwd)))));
      }
      this.summary.replaceChildren(...parts);
      this.rendered.summary = summaryKey;
    }

    // The terminal output's part of the key is a counter, not the text: it may be 200 KB.
    const contentBase = JSON.stringify([s.kind, s.content, this.terminalClipped, this.terminalExit ?? null, cwd]);
    const contentKey = `${contentBase}#${this.terminalSeq}`;
    if (this.rendered.content !== contentKey && this.rendered.contentBase === contentBase && this.terminalPre
      && appendTerminal(this.terminalPre, this.terminalOut.slice(0, this.terminalShown), this.terminalOut.slice(this.terminalShown))) {
      // Only new output, and nothing it rewrites: appended to the block as it is.
      this.terminalShown = this.terminalOut.length;
      this.rendered.content = contentKey;
    } else if (this.rendered.content !== contentKey) {
      const nodes = s.content.map((item) => this.#contentNode(item, cwd)).filter(Boolean);
      this.terminalPre = this.terminalOut ? renderTerminal(this.terminalOut, { clipped: this.terminalClipped }) : null;
      this.terminalShown = this.terminalOut.length;
      if (this.terminalPre) nodes.push(this.terminalPre);
      if (this.terminalExit) {
        const code = this.terminalExit.exit_code ?? this.terminalExit.exitCode;
        const signal = this.terminalExit.signal;
        const text = Number.isInteger(code) ? `exit code ${code}` : isString(signal) && signal ? `ended by signal ${signal.slice(0, 40)}` : 'ended';
        nodes.push(h('p', { class: 'tc-note', testid: 'tool-exit-code', text }));
      }
      this.contentEl.replaceChildren(...nodes);
      this.rendered.content = contentKey;
      this.rendered.contentBase = contentBase;
      this.hasDiff = s.content.some((c) => c?.type === 'diff');
      this.hasTerminal = nodes.some((n) => n.classList?.contains('tc-terminal'));
    }

    const rawKey = JSON.stringify([s.kind, s.rawInput ?? null, s.rawOutput ?? null, s.locations.length, this.hasDiff]);
    if (this.rendered.raw !== rawKey) {
      const parts = [];
      if (s.rawInput !== undefined && !this.#inputShown()) {
        parts.push(h('details', { class: 'tc-json', testid: 'tool-raw-input' }, h('summary', { text: 'Input' }), h('pre', { tabindex: '0', text: prettyJson(s.rawInput) })));
      }
      const exit = exitCodeOf(s.rawOutput);
      if (exit != null) {
        parts.push(h('p', { class: 'tc-note', testid: 'tool-exit-code', text: `exit code ${exit}` }));
      } else if (s.rawOutput !== undefined) {
        parts.push(h('details', { class: 'tc-json', testid: 'tool-raw-output' }, h('summary', { text: 'Output' }), h('pre', { tabindex: '0', text: prettyJson(s.rawOutput) })));
      }
      this.rawEl.replaceChildren(...parts);
      this.rendered.raw = rawKey;
    }

    const empty = !this.contentEl.childElementCount && !this.rawEl.childElementCount;
    this.root.toggleAttribute('data-empty', empty);
    this.#applyExpanded();
  }

  /**
   * Whether the card already shows all of its rawInput: an execute call's command (its
   * description is the title, its cwd is the session's), or a path that is the card's location
   * or diff. Anything else goes in an "Input" details.
   */
  #inputShown() {
    const { rawInput, kind, locations } = this.state;
    if (kind === 'execute' && commandOf(rawInput) && (isString(rawInput) || Array.isArray(rawInput)
      || Object.keys(rawInput).every((k) => ['command', 'cmd', 'cwd', 'description'].includes(k)))) return true;
    const pathKeys = ['path', 'file_path', 'filePath', 'abs_path'];
    return (locations.length > 0 || this.hasDiff) && rawInput && typeof rawInput === 'object' && !Array.isArray(rawInput)
      && Object.keys(rawInput).length > 0 && Object.keys(rawInput).every((k) => pathKeys.includes(k));
  }

  /**
   * Zed's and Claude Code's habit: a call shows its output while it runs; once done it folds away,
   * except what the user came to see: a diff, terminal output, or a failure.
   */
  #applyExpanded() {
    const s = this.state;
    const auto = s.status !== 'completed' || this.hasDiff || this.hasTerminal;
    const open = this.expanded ?? auto;
    const empty = this.root.hasAttribute('data-empty');
    this.toggle.setAttribute('aria-expanded', String(open && !empty));
    this.body.hidden = !open || empty;
    this.toggle.disabled = empty;
  }

  #contentNode(item, cwd) {
    if (!item || typeof item !== 'object') return null;
    if (item.type === 'diff') return renderDiff(item, cwd);
    if (item.type === 'terminal') {
      if (this.terminalOut) return null; // its output came in `_meta.terminal_output`: shown below
      return h('p', { class: 'tc-note tc-terminal-ref', testid: 'tool-terminal-ref' },
        `Live terminal ${isString(item.terminalId) ? item.terminalId : ''}: the web UI does not host agent terminals, so its output is not shown here.`);
    }
    if (item.type === 'content') return this.#blockNode(item.content);
    return h('pre', { class: 'tc-text', tabindex: '0', text: prettyJson(item) });
  }

  /**
   * A content block: text as a terminal (execute calls, ANSI text), as highlighted code (a read
   * of a file in a known language), else as Markdown like the messages (agents such as
   * claude-code-acp send tool output as Markdown); other blocks as the messages show them.
   */
  #blockNode(block) {
    if (!block || typeof block !== 'object') return null;
    if (block.type !== 'text') return contentBlock(block);
    const text = isString(block.text) ? block.text : '';
    if (this.state.kind === 'execute' || hasAnsi(text)) return renderTerminal(text);
    const lang = this.state.kind === 'read' && text.includes('\n') && !/^\s*(```|~~~)/.test(text) ? languageFor(this.#mainPath()) : null;
    if (lang) return h('div', { class: 'tc-code', testid: 'tool-text' }, codeView(text, lang));
    return h('div', { class: 'md tc-md', testid: 'tool-text', tabindex: '0' }, renderMarkdown(text));
  }

  /** The file the call is about: its first location, else a path in its input. */
  #mainPath() {
    const { locations, rawInput } = this.state;
    const located = locations.find((l) => isString(l?.path))?.path;
    if (located) return located;
    const input = rawInput && typeof rawInput === 'object' ? rawInput : {};
    return [input.path, input.file_path, input.filePath, input.abs_path].find(isString) ?? '';
  }
}
