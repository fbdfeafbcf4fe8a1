// Tool call cards for the conversation: one card per ACP `toolCallId`, by kind and status, with
// `diff` content as a unified (or side-by-side) diff, terminal output with ANSI colours, and
// locations that open a file viewer (GET /api/fs/file).
//
// Layout of this file:
//   1. helpers         — SVG icons, kinds and statuses, links that open the file viewer
//   2. diff            — `diff` content through jsdiff
//   3. ToolCard        — merges `tool_call` / `tool_call_update` per ACP and renders the card
//
// Terminal output (ANSI through anser) is drawn by terminal.js, the file viewer (a <dialog>
// showing one file at one line) is file-viewer.js, and both it and the diffs highlight code line
// by line with highlight-lines.js.
//
// Everything an agent sends is untrusted: it reaches the DOM as text nodes, as CSSOM properties
// (`el.style.color`) or as element classes from a fixed list; never through innerHTML and never
// as a `style="..."` string (the page's CSP forbids inline styles anyway).

import { diffRows, replacementRows } from './diff-rows.js';
import { atEnd, el as h, isString } from './dom.js';
import { codeView, renderMarkdown } from './markdown.js';
import { contentBlock } from './content.js';
import { displayPath, openFileViewer } from './file-viewer.js';
import { highlightLines, languageFor } from './highlight-lines.js';
import { appendTerminal, hasAnsi, renderTerminal, TERMINAL_CHAR_CAP } from './terminal.js';

// ---------------------------------------------------------------------------------------------
// 1. Helpers

/** Rows of a diff rendered before a "show all" button. */
export const DIFF_ROW_CAP = 2000;
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

/** An agent's path made absolute against the session cwd (ACP paths should already be absolute). */
function absolutePath(p, cwd) {
  if (!isString(p) || !p) return '';
  if (p.startsWith('/') || !isString(cwd) || !cwd) return p;
  return `${cwd.replace(/\/+$/, '')}/${p.replace(/^\.\//, '')}`;
}

/** A button that opens `path` (at `line`) in the file viewer; its label is relative to the cwd. */
function fileLink(path, line, cwd, { testid = 'tool-location', className = 'tc-location', showLine = true } = {}) {
  const abs = absolutePath(path, cwd);
  const shown = displayPath(abs, cwd) || abs;
  const label = showLine && Number.isInteger(line) && line > 0 ? `${shown}:${line}` : shown;
  return h('button', {
    type: 'button', class: className, testid, title: abs, 'data-path': abs,
    'data-line': Number.isInteger(line) ? line : null,
    'aria-label': `Open ${label}`,
    onclick: (event) => openFileViewer(abs, line, { cwd, opener: event.currentTarget }),
  }, h('span', { class: 'tc-location-text', text: label }));
}

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
// 2. Diff

const WIDE = window.matchMedia('(min-width: 1000px)');
const VIEW_KEY = 'acp-gateway.diffView';

function preferredView() {
  try {
    return localStorage.getItem(VIEW_KEY) === 'split' ? 'split' : 'unified';
  } catch {
    return 'unified';
  }
}

function setPreferredView(view) {
  try { localStorage.setItem(VIEW_KEY, view); } catch { /* private mode */ }
  rerenderDiffs();
}

/** Diffs on screen re-render when the layout preference or the window width class changes. */
function rerenderDiffs() {
  document.querySelectorAll('.tc-diff').forEach((el) => el.rerender?.());
}
WIDE.addEventListener('change', rerenderDiffs);

/** How long the page itself may spend on a diff before handing it to the worker. */
const DIFF_INLINE_MS = 100;

let diffWorker = null;
const diffJobs = new Map(); // job id → resolve
let diffJobSeq = 0;

/** Rows for a diff too slow for the page: from diff-worker.js, or a replacement if workers fail. */
function diffOffThread(oldText, newText) {
  return new Promise((resolve) => {
    if (!diffWorker) {
      try {
        diffWorker = new Worker(new URL('./diff-worker.js', import.meta.url), { type: 'module' });
      } catch {
        resolve({ rows: replacementRows(oldText, newText), exact: false });
        return;
      }
      diffWorker.onmessage = ({ data }) => {
        diffJobs.get(data.id)?.(data);
        diffJobs.delete(data.id);
      };
      diffWorker.onerror = (event) => {
        event.preventDefault();
        for (const done of diffJobs.values()) done(null);
        diffJobs.clear();
        diffWorker = null;
      };
    }
    const id = ++diffJobSeq;
    diffJobs.set(id, (answer) => resolve(answer ?? { rows: replacementRows(oldText, newText), exact: false }));
    diffWorker.postMessage({ id, oldText, newText });
  });
}

const SIGNS = { add: '+', del: '−', ctx: ' ' };
const ROW_NAMES = { add: 'added', del: 'removed', ctx: 'unchanged' };

/** The highlighted nodes of a row's text: from the whole file's highlighting when its line matches. */
function rowCode(row, oldLines, newLines, oldHl, newHl) {
  const pick = (lines, hl, no) => (no != null && lines[no - 1] === row.text ? hl[no - 1] : null);
  const nodes = (row.type === 'add' ? pick(newLines, newHl, row.new) : pick(oldLines, oldHl, row.old))
    ?? (row.text ? [document.createTextNode(row.text)] : []);
  return h('td', { class: 'tc-code' }, row.marks ? markRanges(nodes, row.marks) : nodes.map((n) => n.cloneNode(true)));
}

/**
 * Copies of `nodes` (text, or spans of highlighting around text) with the characters in `ranges`
 * ([start, end) offsets into their text, sorted) wrapped in `span.tc-word`.
 */
function markRanges(nodes, ranges) {
  let offset = 0;
  const visit = (node) => {
    if (node.nodeType !== Node.TEXT_NODE) {
      const copy = node.cloneNode(false);
      for (const child of node.childNodes) copy.append(...visit(child));
      return [copy];
    }
    const text = node.data;
    const out = [];
    let i = 0;
    while (i < text.length) {
      const at = offset + i;
      const inside = ranges.find(([start, end]) => at >= start && at < end);
      const stop = inside ? inside[1] : Math.min(...ranges.filter(([start]) => start > at).map(([start]) => start), Infinity);
      const j = Math.min(text.length, stop - offset);
      const piece = text.slice(i, j);
      out.push(inside ? h('span', { class: 'tc-word' }, piece) : document.createTextNode(piece));
      i = j;
    }
    offset += text.length;
    return out;
  };
  return nodes.flatMap(visit);
}

function unifiedTable(rows, code) {
  return h('table', { class: 'tc-diff-table tc-unified' },
    h('tbody', {}, rows.map((row) => {
      if (row.type === 'hunk' || row.type === 'note') {
        return h('tr', { class: `tc-row tc-${row.type}` }, h('td', { class: 'tc-hunk-text', colspan: 4, text: row.text }));
      }
      return h('tr', { class: `tc-row tc-${row.type}`, testid: 'diff-line', 'data-type': row.type },
        h('td', { class: 'tc-ln', 'data-n': row.old ?? '', 'aria-hidden': 'true' }),
        h('td', { class: 'tc-ln', 'data-n': row.new ?? '', 'aria-hidden': 'true' }),
        h('td', { class: 'tc-sign', 'aria-label': ROW_NAMES[row.type], text: SIGNS[row.type] }),
        code(row));
    })));
}

/** Side by side: runs of removals and additions paired line by line, context on both sides. */
function splitTable(rows, code) {
  const body = [];
  const cell = (row, side) => (row
    ? [h('td', { class: `tc-ln tc-${row.type}`, 'data-n': row[side] ?? '', 'aria-hidden': 'true' }),
      (() => { const td = code(row); td.classList.add(`tc-${row.type}`); return td; })()]
    : [h('td', { class: 'tc-ln tc-empty' }), h('td', { class: 'tc-code tc-empty' })]);
  let i = 0;
  while (i < rows.length) {
    const row = rows[i];
    if (row.type === 'hunk' || row.type === 'note') {
      body.push(h('tr', { class: `tc-row tc-${row.type}` }, h('td', { class: 'tc-hunk-text', colspan: 4, text: row.text })));
      i += 1;
    } else if (row.type === 'ctx') {
      body.push(h('tr', { class: 'tc-row tc-ctx', testid: 'diff-line', 'data-type': 'ctx' }, cell(row, 'old'), cell(row, 'new')));
      i += 1;
    } else {
      const dels = [];
      const adds = [];
      while (rows[i]?.type === 'del') dels.push(rows[i++]);
      while (rows[i]?.type === 'add') adds.push(rows[i++]);
      for (let k = 0; k < Math.max(dels.length, adds.length); k += 1) {
        const type = dels[k] && adds[k] ? 'change' : dels[k] ? 'del' : 'add';
        body.push(h('tr', { class: `tc-row tc-${type}`, testid: 'diff-line', 'data-type': type },
          cell(dels[k], 'old'), cell(adds[k], 'new')));
      }
    }
  }
  return h('table', { class: 'tc-diff-table tc-split' },
    h('colgroup', {}, h('col', { class: 'tc-col-ln' }), h('col'), h('col', { class: 'tc-col-ln' }), h('col')),
    h('tbody', {}, body));
}

/**
 * ACP `diff` content: {path, oldText (null: a new file), newText}. A diff jsdiff cannot finish in
 * DIFF_INLINE_MS is computed by the worker and filled in when it answers.
 */
function renderDiff(item, cwd) {
  const path = isString(item.path) ? item.path : '';
  const isNew = item.oldText == null;
  const oldText = isNew ? '' : String(item.oldText);
  const newText = isString(item.newText) ? item.newText : String(item.newText ?? '');
  const lang = languageFor(path);

  const body = h('div', { class: 'tc-diff-body' });
  const toggle = h('button', { type: 'button', class: 'tc-diff-toggle', testid: 'diff-view-toggle', hidden: true });
  const stat = h('span', { class: 'tc-stat' });
  const badge = h('span', { class: 'tc-badge', hidden: true });
  // The path opens the viewer at the first change once the diff is known.
  const pathLink = (line) => fileLink(path, line, cwd, { testid: 'diff-path', className: 'tc-location tc-diff-path', showLine: false });
  let link = path ? pathLink(null) : h('span', { text: '(no path)' });
  const header = h('div', { class: 'tc-diff-head' },
    link,
    isNew ? h('span', { class: 'tc-badge tc-new', text: 'new file' }) : null,
    badge, stat, toggle);
  const root = h('div', { class: 'tc-diff', testid: 'tool-diff', 'data-path': path, 'data-new-file': isNew ? 'true' : 'false' }, header, body);

  // Highlighting is computed once per diff, on first use, and shared by both layouts.
  let hl = null;
  const code = (row) => {
    if (!hl) {
      const oldLines = oldText.split('\n');
      const newLines = newText.split('\n');
      hl = { oldLines, newLines, oldHl: highlightLines(oldText, lang), newHl: highlightLines(newText, lang) };
    }
    return rowCode(row, hl.oldLines, hl.newLines, hl.oldHl, hl.newHl);
  };

  let rows = null;
  let exact = true;
  let showAll = false;
  const render = () => {
    if (!rows) return;
    const split = preferredView() === 'split' && WIDE.matches;
    root.dataset.view = split ? 'split' : 'unified';
    toggle.hidden = !WIDE.matches || isNew;
    toggle.textContent = split ? 'Unified' : 'Side by side';
    toggle.setAttribute('aria-label', split ? 'Show this diff unified' : 'Show this diff side by side');
    const lineRows = rows.filter((r) => r.type !== 'hunk' && r.type !== 'note').length;
    const shown = showAll || lineRows <= DIFF_ROW_CAP ? rows : capRows(rows, DIFF_ROW_CAP);
    const table = split ? splitTable(shown, code) : unifiedTable(shown, code);
    const parts = [];
    if (!exact) parts.push(h('p', { class: 'tc-note tc-diff-note', text: 'This diff took too long to compute exactly: shown as the whole file replaced.' }));
    parts.push(h('div', { class: 'tc-diff-scroll', tabindex: '0', role: 'group', 'aria-label': `Diff of ${path || 'a file'}` }, table));
    if (shown !== rows) {
      parts.push(h('button', {
        type: 'button', class: 'tc-show-all', testid: 'diff-show-all',
        text: `Show all ${lineRows.toLocaleString()} lines`,
        onclick: () => { showAll = true; render(); },
      }));
    }
    body.replaceChildren(...parts);
  };
  const show = (answer) => {
    rows = answer.rows;
    exact = answer.exact;
    const added = rows.filter((r) => r.type === 'add').length;
    const removed = rows.filter((r) => r.type === 'del').length;
    stat.replaceChildren(h('span', { class: 'tc-stat-add', text: `+${added}` }), ' ', h('span', { class: 'tc-stat-del', text: `−${removed}` }));
    badge.hidden = isNew || added > 0 || removed > 0;
    // The first change's line in the new file (for a removal: the line that now stands there).
    const change = rows.findIndex((r) => r.type === 'add' || r.type === 'del');
    const firstLine = change < 0 ? null : rows.slice(change).find((r) => r.new != null)?.new ?? 1;
    if (path && firstLine) {
      const next = pathLink(firstLine);
      link.replaceWith(next);
      link = next;
    }
    badge.textContent = 'no changes';
    root.dataset.state = 'ready';
    render();
  };
  toggle.addEventListener('click', () => setPreferredView(preferredView() === 'split' ? 'unified' : 'split'));
  root.rerender = render;

  const inline = diffRows(oldText, newText, DIFF_INLINE_MS);
  root.dataset.computedBy = inline ? 'page' : 'worker';
  if (inline) {
    show({ rows: inline, exact: true });
  } else {
    root.dataset.state = 'computing';
    body.append(h('p', { class: 'tc-note', role: 'status', text: 'Computing the diff…' }));
    diffOffThread(oldText, newText).then(show);
  }
  return root;
}

/** The first `cap` line rows (hunk headers are free). */
function capRows(rows, cap) {
  const out = [];
  let n = 0;
  for (const row of rows) {
    if (row.type !== 'hunk' && row.type !== 'note') {
      if (n >= cap) break;
      n += 1;
    }
    out.push(row);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// 3. ToolCard

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
