// `diff` content of a tool call card (tools.js): a unified or side-by-side diff through jsdiff,
// computed on the page when that is quick and by diff-worker.js when it is not, highlighted line
// by line, capped at DIFF_ROW_CAP rows until the reader asks for all.
//
// Everything an agent sends is untrusted: it reaches the DOM as text nodes only (see tools.js).

import { diffRows, replacementRows } from './diff-rows.js';
import { el as h, isString } from './dom.js';
import { fileLink } from './file-viewer.js';
import { highlightLines, languageFor } from './highlight-lines.js';

/** Rows of a diff rendered before a "show all" button. */
export const DIFF_ROW_CAP = 2000;

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
export function renderDiff(item, cwd) {
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
