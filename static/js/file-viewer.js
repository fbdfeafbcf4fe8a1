// The file viewer: a <dialog> showing one file (GET /api/fs/file) at one line, opened from a tool
// card's locations and diff paths (static/js/tools.js, static/js/tool-diff.js). The file's text
// reaches the page as text nodes and highlight.js spans rebuilt by highlight-lines.js, never
// through innerHTML.

import { el as h, isString } from './dom.js';
import { highlightLines, languageFor } from './highlight-lines.js';

/** `abs` shown relative to `cwd` when it lies inside it. */
export function displayPath(abs, cwd) {
  if (!isString(abs)) return '';
  if (!isString(cwd) || !cwd || cwd === '/') return abs;
  const root = cwd.replace(/\/+$/, '');
  if (abs === root) return '.';
  return abs.startsWith(`${root}/`) ? abs.slice(root.length + 1) : abs;
}

let viewer = null;

function viewerParts() {
  if (viewer) return viewer;
  const title = h('h2', { class: 'tc-viewer-title', id: 'tc-viewer-title', testid: 'file-viewer-title' });
  const meta = h('p', { class: 'tc-viewer-meta', testid: 'file-viewer-meta' });
  const close = h('button', { type: 'button', class: 'icon tc-viewer-close', testid: 'file-viewer-close', 'aria-label': 'Close file viewer', text: '×' });
  const body = h('div', { class: 'tc-viewer-body', testid: 'file-viewer-body', tabindex: '0' });
  const dialog = h('dialog', { class: 'tc-viewer', testid: 'file-viewer', 'aria-labelledby': 'tc-viewer-title' },
    h('header', { class: 'tc-viewer-head' }, h('div', { class: 'tc-viewer-heading' }, title, meta), close), body);
  close.addEventListener('click', () => dialog.close());
  // A click on the backdrop (the dialog element itself, outside its content box) closes it.
  dialog.addEventListener('click', (event) => {
    if (event.target !== dialog) return;
    const r = dialog.getBoundingClientRect();
    const inside = event.clientX >= r.left && event.clientX <= r.right && event.clientY >= r.top && event.clientY <= r.bottom;
    if (!inside) dialog.close();
  });
  dialog.addEventListener('close', () => {
    viewer.token += 1; // a fetch still in flight must not fill a closed viewer
    const opener = viewer.opener;
    viewer.opener = null;
    if (opener?.isConnected) opener.focus();
  });
  document.body.append(dialog);
  viewer = { dialog, title, meta, body, close, token: 0, opener: null };
  return viewer;
}

/** What the viewer says when GET /api/fs/file refuses (fs.rs: {error, roots?}). */
function viewerMessage(status, body) {
  const detail = isString(body?.error) ? body.error : isString(body?.error?.message) ? body.error.message : '';
  switch (status) {
    case 401: return 'You are signed out; reload the page to sign in again.';
    case 403: {
      if (!Array.isArray(body?.roots)) return 'Permission denied: the gateway cannot read this file.';
      const roots = body.roots.filter(isString);
      return `This file is outside your workspace${roots.length ? ` (${roots.join(', ')})` : ''}, so the gateway will not show it.`;
    }
    case 404: return 'This file does not exist (any more).';
    case 415: return 'This is a binary file; it cannot be shown as text.';
    default: return `The gateway answered ${status}${detail ? `: ${detail}` : ''}.`;
  }
}

/** Opens the viewer on `path` (absolute) and scrolls to `line` (1-based) when given. */
export async function openFileViewer(path, line, { cwd, opener } = {}) {
  const v = viewerParts();
  const token = ++v.token;
  const target = Number.isInteger(line) && line > 0 ? line : null;
  v.opener = opener ?? document.activeElement;
  const shown = displayPath(path, cwd) || path;
  v.title.textContent = target ? `${shown}:${target}` : shown;
  v.title.title = path;
  v.meta.textContent = 'Loading…';
  v.dialog.dataset.state = 'loading';
  v.dialog.dataset.path = path;
  v.body.replaceChildren();
  if (!v.dialog.open) v.dialog.showModal();
  v.close.focus();

  let res;
  let data = null;
  try {
    res = await fetch(`/api/fs/file?path=${encodeURIComponent(path)}`, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
    if (res.ok) data = await res.json();
  } catch (err) {
    if (token === v.token) viewerError(v, `Could not load the file: ${err.message}`, 'network');
    return;
  }
  if (token !== v.token) return;
  if (!res.ok || !data || !isString(data.text)) {
    let body = null;
    try {
      body = res.ok ? null : await res.json();
    } catch { /* not JSON */ }
    if (token !== v.token) return;
    viewerError(v, viewerMessage(res.status, body), String(res.status));
    return;
  }

  const lines = highlightLines(data.text.endsWith('\n') ? data.text.slice(0, -1) : data.text, languageFor(path));
  const size = Number.isFinite(data.size) ? `${data.size.toLocaleString()} bytes` : '';
  v.meta.textContent = [`${lines.length.toLocaleString()} lines`, size, data.truncated ? 'truncated: only the start is shown' : '']
    .filter(Boolean).join(' · ');
  const code = h('div', { class: 'tc-viewer-code', role: 'list', 'aria-label': `Contents of ${shown}` });
  let marked = null;
  lines.forEach((nodes, i) => {
    const n = i + 1;
    const row = h('div', { class: 'tc-vline', role: 'listitem', 'data-n': n, testid: n === target ? 'file-viewer-line' : null },
      h('span', { class: 'tc-vln', 'aria-hidden': 'true', text: String(n) }),
      h('span', { class: 'tc-vcode' }, nodes));
    if (n === target) {
      row.classList.add('tc-target');
      row.setAttribute('aria-current', 'true');
      row.tabIndex = -1;
      marked = row;
    }
    code.append(row);
  });
  v.body.replaceChildren(code);
  if (target && !marked) {
    v.body.prepend(h('p', { class: 'tc-note', role: 'status', text: `Line ${target} is past the end of what is shown.` }));
  }
  v.dialog.dataset.state = 'ready';
  if (marked) {
    marked.scrollIntoView({ block: 'center' });
    marked.focus({ preventScroll: true });
  }
}

function viewerError(v, message, state) {
  v.meta.textContent = '';
  v.dialog.dataset.state = `error-${state}`;
  v.body.replaceChildren(h('p', { class: 'tc-viewer-error', role: 'alert', testid: 'file-viewer-error', 'data-status': state, text: message }));
}

/** An agent's path made absolute against the session cwd (ACP paths should already be absolute). */
function absolutePath(p, cwd) {
  if (!isString(p) || !p) return '';
  if (p.startsWith('/') || !isString(cwd) || !cwd) return p;
  return `${cwd.replace(/\/+$/, '')}/${p.replace(/^\.\//, '')}`;
}

/** A button that opens `path` (at `line`) in the file viewer; its label is relative to the cwd. */
export function fileLink(path, line, cwd, { testid = 'tool-location', className = 'tc-location', showLine = true } = {}) {
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
