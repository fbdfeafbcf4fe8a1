// Sharing a session with a teammate, and the sessions teammates share with you.
// - The topbar's Share button (own sessions only) opens a dialog: share with a user by name, or
//   make a link, as an observer (sees it live, read-only; the default) or a controller, for a
//   while or until revoked; every share is listed there and revocable. The dialog says plainly
//   what a controller can do: their prompts run the owner's agent, which runs commands as the
//   owner, with their keys and files. Choosing it takes a confirmation; a controller link ends
//   after a day unless another end is chosen (never "until revoked"); the owner's stored agent
//   keys and MCP servers' headers are withheld (their prompts are refused while the agent holds
//   them) unless the owner ticks a second box (`ownerKeys`).
// - A link is `/#share=TOKEN`: the token is in the fragment, which browsers never send to a
//   server, and it is shown once, when made (the gateway keeps only its hash). Opening one
//   redeems it (POST /api/shares/redeem) and opens the session; the token is kept in
//   sessionStorage across a sign-in and dropped from the address bar.
// - "Shared with you" in the sidebar lists what others share (GET /api/shared).
// Strings only ever go to textContent.

import { el as h } from './dom.js';
import { relativeTime, send } from './http.js';

const KEPT = 'acp-share-token';
const EXPIRIES = [['', 'Until revoked'], ['3600', '1 hour'], ['86400', '1 day'], ['604800', '7 days']];
/** What a controller can do, said the same way wherever it is said. */
const CONTROLLER_CAN = 'runs commands as you, with your keys and files';

/** A link's token from the address (`#share=TOKEN`), or one kept across a sign-in; the address
 *  loses it at once. */
export function takeShareToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromHash = hash.get('share');
  if (fromHash) {
    sessionStorage.setItem(KEPT, fromHash);
    history.replaceState(null, '', location.pathname + location.search);
  }
  return sessionStorage.getItem(KEPT);
}

/** Redeems a link's `token` and opens its session in the role it gives: `listed()` reloads
 *  "Shared with you" (its entries), `open(entry)` opens one, `agent` is the default agent; the
 *  owner (`me`) opening their own link gets their session as theirs (`own(id)`). */
export async function openShareLink(token, { me, listed, open, own, agent }) {
  sessionStorage.removeItem(KEPT);
  let r;
  try {
    r = await send('POST', '/api/shares/redeem', { token });
  } catch (err) {
    throw err.status === 404 ? new Error('This share link is unknown, revoked or expired.') : err;
  }
  if (r.owner === me) return own(r.sessionId);
  const entry = (await listed()).find((s) => s.sessionId === r.sessionId);
  open(entry ? sharedEntry(entry) : { id: r.sessionId, title: '', agent, role: r.role, owner: r.owner, cwd: '' });
}

/** The list entry and current-session fields of a session shared with the user. */
export function sharedEntry(s) {
  return { id: s.sessionId, title: s.title ?? '', agent: s.agent, role: s.role, owner: s.owner, cwd: '' };
}

/** "Shared with you" in the sidebar: fills `list` (its `section` hidden when empty). */
export async function loadSharedWithMe({ section, list }, open) {
  const answer = await send('GET', '/api/shared');
  const sessions = Array.isArray(answer?.sessions) ? answer.sessions : [];
  section.hidden = !sessions.length;
  list.replaceChildren(...sessions.map((s) => h('li', { class: 'shared-item' },
    h('button', { type: 'button', class: 'session-open', testid: 'shared-session', 'data-session': s.sessionId,
      onclick: () => open(sharedEntry(s)) },
    h('span', { class: 'session-title', text: s.title || 'Untitled session' }),
    h('span', { class: 'muted small', text: `${s.owner} · ${s.role}${s.expiresAt ? ` · ends ${relativeTime(s.expiresAt)}` : ''}` })))));
  return sessions;
}

/** How a share is described in the owner's list. */
function describe(share) {
  const who = share.link ? `Link (${share.members} opened)` : share.user;
  const ends = share.expiresAt ? `ends ${relativeTime(share.expiresAt)}` : 'until revoked';
  const keys = share.ownerKeys ? ' · may use your keys' : '';
  return `${who} · ${share.role}${keys} · ${ends}`;
}

/** Opens the Share dialog for the user's own session `id`. */
export function openShareDialog(id) {
  const path = `/api/sessions/${encodeURIComponent(id)}/shares`;
  const error = h('p', { class: 'error', role: 'alert', testid: 'share-error', hidden: true });
  const fail = (err) => { error.textContent = err.message; error.hidden = false; };
  const list = h('ul', { class: 'share-list', testid: 'share-list' });
  const made = h('div', { class: 'share-made', testid: 'share-made', hidden: true });
  const user = h('input', { type: 'text', maxlength: '256', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'their user name (leave empty for a link)', testid: 'share-user' });
  const role = h('select', { testid: 'share-role' },
    h('option', { value: 'observer', text: 'Observer: sees it live, read-only', selected: true }),
    h('option', { value: 'controller', text: `Controller: prompts your agent, which ${CONTROLLER_CAN}` }));
  const expiry = h('select', { testid: 'share-expiry' }, ...EXPIRIES.map(([v, t]) => h('option', { value: v, text: t })));
  const untilRevoked = expiry.options[0];
  const confirm = h('input', { type: 'checkbox', testid: 'share-confirm' });
  const ownerKeys = h('input', { type: 'checkbox', testid: 'share-owner-keys' });
  const warning = h('div', { class: 'share-warning', testid: 'share-warning', hidden: true },
    h('p', {}, h('strong', { text: `A controller ${CONTROLLER_CAN}.` }),
      ' Their prompts go to your agent, which works in your home and every workspace of yours, signed in as you. Revoking the share does not undo what they ran.'),
    h('p', { class: 'small', text: 'Keys you stored for this agent and your MCP servers\' secret headers are withheld: their prompts are refused while the agent holds them, unless you allow it below. A controller link ends after a day unless you choose another end.' }),
    h('label', { class: 'share-check' }, confirm, h('span', { text: 'I understand: they can run commands as me' })),
    h('label', { class: 'share-check' }, ownerKeys, h('span', { text: 'Also let their prompts use my stored agent keys and MCP servers\' headers' })));
  // A controller is a choice made knowingly, and a controller link always ends.
  const shape = () => {
    const controller = role.value === 'controller';
    warning.hidden = !controller;
    confirm.required = controller;
    const link = controller && !user.value.trim();
    untilRevoked.disabled = link;
    if (link && !expiry.value) expiry.value = '86400';
  };
  role.addEventListener('change', shape);
  user.addEventListener('input', shape);
  const load = async () => {
    const answer = await send('GET', path);
    const shares = Array.isArray(answer?.shares) ? answer.shares : [];
    list.replaceChildren(...(shares.length ? shares.map((s) => h('li', { class: 'share-row', testid: 'share-row' },
      h('span', { text: describe(s) }),
      h('button', { type: 'button', class: 'danger small', text: 'Revoke', testid: 'share-revoke', 'aria-label': `Revoke ${describe(s)}`,
        onclick: () => send('DELETE', `${path}/${encodeURIComponent(s.id)}`).then(load).catch(fail) })))
      : [h('li', { class: 'muted', text: 'Not shared with anyone.' })]));
  };
  const showLink = (token) => {
    const url = `${location.origin}/#share=${encodeURIComponent(token)}`;
    const field = h('input', { type: 'text', readOnly: true, value: url, 'aria-label': 'Share link', testid: 'share-link' });
    made.replaceChildren(
      h('p', { class: 'small', text: 'Anyone signed in who opens this link can reach the session. It is shown only now: copy it.' }),
      field,
      h('button', { type: 'button', class: 'secondary small', text: 'Copy link', testid: 'share-copy',
        onclick: () => { field.select(); navigator.clipboard?.writeText(url).catch(() => {}); } }));
    made.hidden = false;
    field.select();
  };
  const form = h('form', { class: 'share-form', testid: 'share-form' },
    h('label', { class: 'field' }, h('span', { text: 'Share with' }), user),
    h('label', { class: 'field' }, h('span', { text: 'Role' }), role),
    warning,
    h('label', { class: 'field' }, h('span', { text: 'For' }), expiry),
    h('div', { class: 'dialog-actions' }, h('button', { type: 'submit', class: 'primary', text: 'Share', testid: 'share-submit' })));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.hidden = true;
    made.hidden = true;
    const body = { role: role.value };
    if (user.value.trim()) body.user = user.value.trim();
    if (expiry.value) body.expiresInSecs = Number(expiry.value);
    if (role.value === 'controller' && ownerKeys.checked) body.ownerKeys = true;
    try {
      const answer = await send('POST', path, body);
      if (answer?.token) showLink(answer.token);
      user.value = '';
      role.value = 'observer';
      confirm.checked = false;
      ownerKeys.checked = false;
      shape();
      await load();
    } catch (err) { fail(err); }
  });
  const close = h('button', { type: 'button', class: 'secondary small', text: 'Close', testid: 'share-close', onclick: () => dialog.close() });
  const dialog = h('dialog', { class: 'admin-dialog share-dialog', 'aria-labelledby': 'share-heading', testid: 'share-dialog' },
    h('div', { class: 'admin-head' }, h('h2', { id: 'share-heading', text: 'Share this session' }), close),
    h('p', { class: 'muted small', testid: 'share-roles', text: `An observer sees the session live, read-only. A controller also prompts your agent, which ${CONTROLLER_CAN}. Revoking a share, or its end, closes it for whoever it let in.` }),
    list, form, made, error);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  load().catch(fail);
}
