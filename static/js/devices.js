// Programs signed in by device code (`acp-gateway login`, `connect` in an editor): listed with
// their last use in the "?" dialog, each revocable at once.

import { el as h, $ } from './dom.js';
import { send } from './http.js';

function when(secs) {
  return secs ? new Date(secs * 1000).toLocaleString() : 'never';
}

export async function renderDevices() {
  const list = $('signed-in-devices');
  const note = $('signed-in-note');
  if (!list || !note) return;
  const fail = (err) => { note.textContent = `Your devices could not be listed: ${err.message}.`; };
  let state;
  try { state = await send('GET', '/api/devices'); } catch (err) { return fail(err); }
  note.textContent = state.devices.length
    ? 'These programs are signed in as you (acp-gateway login); revoking one signs it out at once:'
    : 'No program is signed in as you. `acp-gateway login URL` on a computer signs one in with a code you approve here.';
  list.replaceChildren(...state.devices.map((d) => h('li', { class: 'push-device', testid: 'signed-in-device' },
    h('span', { text: `${d.name}, from ${d.address || 'an unknown address'}: last used ${when(d.lastUsedAt)}` }),
    h('button', { type: 'button', class: 'secondary small', text: 'Revoke', 'aria-label': `Sign ${d.name} out`,
      onclick: () => send('DELETE', `/api/devices/${encodeURIComponent(d.id)}`).then(renderDevices).catch(fail) }))));
}
