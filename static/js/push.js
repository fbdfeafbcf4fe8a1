// Push to your devices: this device opts in to Web Push (a service worker, static/sw.js, and
// the browser's push service, with the gateway's VAPID key), and the devices opted in are listed
// with Remove (/api/push). The gateway pushes when a session no tab shows needs the user.

import { el as h, $ } from './dom.js';
import { send } from './http.js';

function bytes(base64url) {
  const text = atob(base64url.replace(/-/g, '+').replace(/_/g, '/'));
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

/** What to call this device in the list. */
function deviceLabel() {
  const ua = navigator.userAgent;
  const os = /Android/.test(ua) ? 'Android' : /iPhone|iPad/.test(ua) ? 'iOS' : /Mac OS/.test(ua) ? 'macOS' : /Windows/.test(ua) ? 'Windows' : /Linux/.test(ua) ? 'Linux' : 'a device';
  const browser = /Edg\//.test(ua) ? 'Edge' : /Firefox\//.test(ua) ? 'Firefox' : /Chrome\//.test(ua) ? 'Chrome' : /Safari\//.test(ua) ? 'Safari' : 'a browser';
  return `${browser} on ${os}`;
}

/** Opts this device in. */
async function enable(publicKey) {
  if (!('serviceWorker' in navigator) || !('PushManager' in window)) {
    throw new Error('this browser cannot receive push notifications (on an iPhone, add the page to the home screen first)');
  }
  const registration = await navigator.serviceWorker.register('/sw.js');
  await navigator.serviceWorker.ready;
  if (await Notification.requestPermission() !== 'granted') throw new Error('notifications are blocked for this site');
  const subscription = await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(publicKey) });
  // Pushes carry no transcript text; the session's title only if the user ticks the box.
  const titles = $('push-titles')?.checked === true;
  await send('POST', '/api/push/subscriptions', { ...subscription.toJSON(), label: deviceLabel(), titles });
}

/** Fills the push section of the help dialog (call when it opens). */
export async function renderPush() {
  const list = $('push-devices');
  const note = $('push-note');
  const button = $('push-enable');
  if (!list || !note || !button) return;
  const fail = (err) => { note.textContent = `Push is not on: ${err.message}.`; };
  let state;
  try { state = await send('GET', '/api/push'); } catch (err) { return fail(err); }
  button.hidden = !state.enabled;
  note.textContent = !state.enabled
    ? 'This gateway sends no push notifications.'
    : state.devices.length
      ? 'These devices get a push when a session you are not looking at needs you or finishes:'
      : 'Get a push on this device when a session you are not looking at asks for permission or finishes.';
  list.replaceChildren(...state.devices.map((d) => h('li', { class: 'push-device', testid: 'push-device' },
    h('span', { text: `${d.label} (${d.service})` }),
    h('button', { type: 'button', class: 'secondary small', text: 'Remove', 'aria-label': `Stop pushing to ${d.label}`,
      onclick: () => send('DELETE', `/api/push/subscriptions/${encodeURIComponent(d.id)}`).then(renderPush).catch(fail) }))));
  button.onclick = async () => {
    button.disabled = true;
    try { await enable(state.publicKey); await renderPush(); } catch (err) { fail(err); } finally { button.disabled = false; }
  };
}
