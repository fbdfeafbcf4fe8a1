// The Admin page (for the gateway's administrators, /api/me says `admin: true`): users seen,
// live sessions of anyone (with Stop), spending this month, and the audit log (filters, pages).
// Everything comes from /api/admin/*; nothing here reads a transcript. Strings only ever go to
// textContent.

import { el as h } from './dom.js';

async function get(path) {
  const res = await fetch(path, { credentials: 'same-origin' });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body?.error ?? `HTTP ${res.status}`);
  return body;
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : '—');
const bytes = (n) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`);

function table(testid, head, rows) {
  return h('table', { class: 'admin-table', testid },
    h('thead', {}, h('tr', {}, head.map((t) => h('th', { scope: 'col', text: t })))),
    h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: String(head.length), class: 'muted', text: 'Nothing yet.' }))));
}

const cell = (text) => h('td', { text: String(text ?? '') });

async function users() {
  const { users: list } = await get('/api/admin/users');
  return table('admin-users', ['User', 'Sessions', 'Stored', 'Last active', 'Last sign-in', 'Live sessions', 'Agent processes'],
    list.map((u) => h('tr', {}, cell(u.user), cell(u.sessions), cell(bytes(u.storedBytes ?? 0)), cell(when(u.lastActive)),
      cell(when(u.lastSignIn)), cell(u.liveSessions), cell(u.agentProcesses))));
}

async function sessions(refresh) {
  const { sessions: list } = await get('/api/admin/sessions');
  return table('admin-sessions', ['Owner', 'Agent', 'State', 'Since', 'Session', ''],
    list.map((s) => {
      const stop = h('button', {
        type: 'button', class: 'danger small', testid: 'admin-stop', 'data-session-id': s.sessionId, text: 'Stop',
        onclick: async () => {
          stop.disabled = true;
          const res = await fetch(`/api/admin/sessions/${encodeURIComponent(s.sessionId)}/stop`, { method: 'POST', credentials: 'same-origin' });
          if (!res.ok) stop.disabled = false;
          refresh();
        },
      });
      return h('tr', { 'data-session-id': s.sessionId }, cell(s.owner), cell(s.agent), cell(s.state), cell(when(s.since)),
        h('td', {}, h('code', { text: s.sessionId })), h('td', {}, stop));
    }));
}

async function usage() {
  const { days, caps } = await get('/api/admin/usage');
  const note = caps?.daily != null || caps?.monthly != null
    ? `Caps per person: ${caps.daily != null ? `${caps.daily} ${caps.currency} a day` : 'none a day'}, ${caps.monthly != null ? `${caps.monthly} ${caps.currency} a month` : 'none a month'}.`
    : 'No cost caps.';
  return h('div', {}, h('p', { class: 'muted small', text: note }),
    table('admin-usage', ['Day', 'User', 'Agent', 'Cost', 'Reports'],
      days.map((d) => h('tr', {}, cell(d.day), cell(d.owner), cell(d.agent), cell(`${d.cost.toFixed(4)} ${d.currency}`), cell(d.updates)))));
}

function audit() {
  const actor = h('input', { type: 'search', placeholder: 'user', testid: 'audit-actor', 'aria-label': 'Filter by user' });
  const action = h('input', { type: 'search', placeholder: 'action (sign_in, admin_stop, …)', testid: 'audit-action', 'aria-label': 'Filter by action' });
  const body = h('tbody', {});
  const more = h('button', { type: 'button', class: 'secondary small', text: 'Older entries', hidden: true });
  let before = null;
  const load = async (reset) => {
    if (reset) { body.replaceChildren(); before = null; }
    const q = new URLSearchParams({ limit: '50' });
    if (actor.value.trim()) q.set('actor', actor.value.trim());
    if (action.value.trim()) q.set('action', action.value.trim());
    if (before != null) q.set('before', String(before));
    const page = await get(`/api/admin/audit?${q}`);
    for (const e of page.entries) {
      body.append(h('tr', { testid: 'audit-entry' }, cell(when(e.at)), cell(e.actor || '(nobody)'), cell(e.action), cell(e.target ?? ''),
        cell(e.outcome), cell(e.detail ? JSON.stringify(e.detail) : ''), cell(e.clientAddr ?? ''), cell(e.replica)));
    }
    before = page.nextBefore;
    more.hidden = before == null;
  };
  more.addEventListener('click', () => load(false));
  const form = h('form', { class: 'admin-filters', onsubmit: (ev) => { ev.preventDefault(); load(true); } },
    actor, action, h('button', { type: 'submit', class: 'secondary small', text: 'Filter' }));
  const view = h('div', {}, form,
    h('table', { class: 'admin-table', testid: 'admin-audit' },
      h('thead', {}, h('tr', {}, ['When', 'Who', 'Action', 'Target', 'Outcome', 'Detail', 'Address', 'Replica'].map((t) => h('th', { scope: 'col', text: t })))),
      body),
    more);
  load(true);
  return view;
}

/** Opens the Admin page as a modal dialog over the app. */
export function openAdmin() {
  const content = h('div', { class: 'admin-content' });
  const tabs = [['Users', users], ['Live sessions', null], ['Spending', usage], ['Audit log', audit]];
  const show = async (name, build) => {
    for (const b of nav.querySelectorAll('button')) b.setAttribute('aria-selected', String(b.dataset.tab === name));
    content.replaceChildren(h('p', { class: 'muted', text: 'Loading…' }));
    try {
      const refresh = () => show(name, build);
      content.replaceChildren(await (build ?? (() => sessions(refresh)))());
    } catch (err) {
      content.replaceChildren(h('p', { class: 'error', role: 'alert', text: err.message }));
    }
  };
  const nav = h('div', { class: 'admin-tabs', role: 'tablist' },
    tabs.map(([name, build]) => h('button', {
      type: 'button', role: 'tab', class: 'secondary small', 'data-tab': name, testid: `admin-tab-${name.toLowerCase().replace(/\s+/g, '-')}`,
      text: name, onclick: () => show(name, build),
    })));
  const close = h('button', { type: 'button', class: 'secondary small', text: 'Close', onclick: () => dialog.close() });
  const dialog = h('dialog', { class: 'admin-dialog', 'aria-labelledby': 'admin-heading', testid: 'admin-dialog' },
    h('div', { class: 'admin-head' }, h('h2', { id: 'admin-heading', text: 'Administration' }), close),
    nav, content);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  show('Users', users);
}
