// Attention: a permission request or a finished turn while this tab is hidden raises a browser
// notification and counts in the tab's title, "(N) …", until the tab is visible again. A tab
// that is visible gets neither: the user is looking at it.
//
// - The Notifications permission is asked for on the user's first prompt of this page (a user
//   gesture), never at page load; without it only the title counts.
// - Notifications are tagged per session, so a session's newer event replaces its older one
//   instead of piling up; all of them close when the tab becomes visible.
// - Clicking one focuses the window and opens its session (app.js's `open` hook), with the
//   permission card in view.
// - Where a page may not construct notifications (Chrome on Android wants a service worker), the
//   title badge is all there is.

/** Events the user has not seen: {sessionId, kind: 'permission' | 'turn', key}. */
const unseen = [];
/** Notifications on screen, by tag: {note, key}. */
const shown = new Map();
let baseTitle = document.title;
let asked = false;
/** app.js: opens `sessionId` and brings permission request `key` (if any) into view. */
let openHook = () => {};

const supported = () => typeof window.Notification === 'function';

/** Wires the hooks; call once. */
export function initAttention({ open }) {
  openHook = open;
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') seenAll();
  });
}

/**
 * Asks for the Notifications permission once per page, from a user gesture (call it
 * synchronously from the handler of the user's action: the browser checks).
 */
export function askForNotifications() {
  if (asked || !supported() || Notification.permission !== 'default') return;
  asked = true;
  try {
    Promise.resolve(Notification.requestPermission()).catch(() => {});
  } catch { /* an older callback-only API: nothing to wait for */ }
}

/** 'granted', 'denied', 'default' or 'unsupported': for the shortcuts dialog's note. */
export function notificationState() {
  return supported() ? Notification.permission : 'unsupported';
}

/** The title without the badge; app.js sets it whenever the open session changes. */
export function setBaseTitle(title) {
  baseTitle = title;
  renderTitle();
}

function renderTitle() {
  const title = unseen.length ? `(${unseen.length}) ${baseTitle}` : baseTitle;
  if (document.title !== title) document.title = title;
}

/**
 * Something in `sessionId` wants the user: `kind` 'permission' (with `key`, its request's
 * key in app.js) or 'turn'. Counted and notified only while the tab is hidden.
 * Returns whether it was counted.
 */
export function notice({ sessionId, kind, key = null, title, body = '' }) {
  if (document.visibilityState !== 'hidden') return false;
  unseen.push({ sessionId, kind, key });
  renderTitle();
  raise({ sessionId, key, title, body });
  return true;
}

function raise({ sessionId, key, title, body }) {
  if (!supported() || Notification.permission !== 'granted') return;
  const tag = `acp-gateway:${sessionId}`;
  let note;
  try {
    note = new Notification(title, { body, tag, renotify: true });
  } catch {
    return; // e.g. Chrome on Android: "Illegal constructor"; the title badge still counts
  }
  shown.set(tag, { note, key });
  note.onclick = (event) => {
    event?.preventDefault?.(); // we focus the window ourselves
    window.focus();
    note.close();
    openHook(sessionId, key);
    seenAll();
  };
  note.onclose = () => {
    if (shown.get(tag)?.note === note) shown.delete(tag);
  };
}

/** A permission request was answered (here or in another tab) or withdrawn: it is no longer news. */
export function resolved(key) {
  const at = unseen.findIndex((e) => e.kind === 'permission' && e.key === key);
  if (at >= 0) unseen.splice(at, 1);
  renderTitle();
  for (const [tag, { note, key: k }] of shown) {
    if (k === key) {
      shown.delete(tag);
      note.close();
    }
  }
}

/** The user is looking: the badge goes and the notifications close. */
function seenAll() {
  unseen.length = 0;
  renderTitle();
  const notes = [...shown.values()];
  shown.clear();
  notes.forEach(({ note }) => note.close());
}
