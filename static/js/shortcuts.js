// Keyboard shortcuts and their help dialog ("?"). The combinations are ones browsers leave to
// pages: Alt+letter (not F/E/D, which Chrome and Firefox keep for their menus and address bar, nor
// Firefox's menu letters), Ctrl/⌘+K, and single keys ("/", "?") only when no text field has focus.
// Keys are matched by `event.code`, so Option+letter on a Mac (which types a character) works
// too, and Alt+letter never fires with Ctrl held (AltGr on Windows types characters with it).
// Each control a shortcut drives says so in its tooltip and in aria-keyshortcuts.

import { closeSidebar, isDrawerOpen, setSidebar, sidebarShown, toggleSidebar } from './layout.js';
import { notificationState } from './attention.js';
import { $ } from './dom.js';

const MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
const ALT = MAC ? '⌥' : 'Alt+';
const MOD = MAC ? '⌘' : 'Ctrl+';

const alt = (code) => (e) => e.altKey && !e.ctrlKey && !e.metaKey && e.code === code;
const typing = (target) => target instanceof Element
  && (target.closest('input, textarea, select, [contenteditable=""], [contenteditable="true"]') != null);

const idle = (target) => target === document.body || target === document.documentElement
  || (target instanceof Element && ['log', 'main'].includes(target.id));

/** Each: what it does, how it is shown, aria-keyshortcuts, which control it drives, its test. */
const SHORTCUTS = [
  {
    action: 'new-session', label: 'New session', shown: [`${ALT}N`], aria: 'Alt+N', control: 'new-session',
    match: alt('KeyN'), run: () => $('new-session')?.click(),
  },
  {
    action: 'search', label: 'Search sessions', shown: [`${MOD}K`, '/'], aria: MAC ? 'Meta+K /' : 'Control+K /',
    control: 'session-search',
    match: (e, busy) => ((e.ctrlKey || e.metaKey) && !e.altKey && !e.shiftKey && e.code === 'KeyK')
      || (!busy && e.key === '/' && !e.ctrlKey && !e.metaKey && !e.altKey),
    run: focusSearch,
  },
  {
    action: 'prompt', label: 'Go to the prompt box', shown: [`${ALT}P`], aria: 'Alt+P', control: 'prompt-input',
    match: alt('KeyP'), run: focusPrompt,
  },
  {
    action: 'stop', label: 'Stop the running turn', shown: ['Esc', `${ALT}.`], aria: 'Escape Alt+.', control: 'stop',
    // Escape only where it means nothing else: on the page, the conversation or its column (the
    // prompt box handles its own, app.js); on a button or a permission card it would be a surprise.
    match: (e) => alt('Period')(e)
      || (e.key === 'Escape' && !e.altKey && !e.ctrlKey && !e.metaKey && !isDrawerOpen() && idle(e.target)),
    run: stop, quiet: () => $('stop')?.hidden !== false, // nothing running: let Escape do what else it does
  },
  {
    action: 'sidebar', label: 'Show or hide the sessions', shown: [`${ALT}L`], aria: 'Alt+L', control: 'sidebar-toggle',
    match: alt('KeyL'), run: toggleSidebar,
  },
  {
    action: 'help', label: 'Keyboard shortcuts', shown: ['?'], aria: '?', control: 'shortcuts-button',
    match: (e, busy) => !busy && e.key === '?' && !e.ctrlKey && !e.metaKey && !e.altKey, run: openHelp,
  },
];

function focusSearch() {
  if (!sidebarShown()) setSidebar(true);
  const search = $('session-search');
  search?.focus();
  search?.select();
}

function focusPrompt() {
  closeSidebar();
  $('prompt-input')?.focus();
}

function stop() {
  const button = $('stop');
  if (button && !button.hidden) button.click();
}

/** Installs the key handler, the tooltips and the help dialog. Call once. */
export function installShortcuts() {
  for (const s of SHORTCUTS) {
    const control = $(s.control);
    if (!control) continue;
    control.setAttribute('aria-keyshortcuts', s.aria);
    const name = control.getAttribute('title') || s.label;
    control.title = `${name.replace(/ \(.*\)$/, '')} (${s.shown.join(' or ')})`;
  }
  $('shortcuts-button')?.addEventListener('click', openHelp);
  $('shortcuts-close')?.addEventListener('click', () => $('shortcuts-dialog')?.close());
  $('notifications-enable')?.addEventListener('click', async () => {
    try { await Notification.requestPermission(); } catch { /* unsupported */ }
    renderNotificationNote();
  });
  renderHelpList();
  document.addEventListener('keydown', onKey);
}

function onKey(event) {
  if (event.defaultPrevented || event.isComposing || event.repeat) return;
  if (modalOpen()) return; // a modal dialog (ours, the cwd picker, the file viewer) has the keyboard
  const busy = typing(event.target);
  for (const s of SHORTCUTS) {
    if (!s.match(event, busy)) continue;
    if (s.quiet?.()) return;
    event.preventDefault();
    s.run();
    return;
  }
}

/** Keys the help lists beside the shortcuts: the prompt box's own. */
const PROMPT_KEYS = [
  { label: 'Send the prompt', shown: ['Enter'] },
  { label: 'New line in the prompt', shown: ['Shift+Enter'] },
];

function modalOpen() {
  try {
    return document.querySelector('dialog:modal') != null;
  } catch { // a browser without :modal
    return document.querySelector('dialog[open]') != null;
  }
}

function renderHelpList() {
  const list = $('shortcuts-list');
  if (!list) return;
  list.replaceChildren(...[...SHORTCUTS, ...PROMPT_KEYS].map((s) => {
    const keys = document.createElement('dd');
    s.shown.forEach((k, i) => {
      if (i) keys.append(' or ');
      const kbd = document.createElement('kbd');
      kbd.textContent = k;
      keys.append(kbd);
    });
    const what = document.createElement('dt');
    what.textContent = s.label;
    const row = document.createElement('div');
    row.className = 'shortcut';
    row.append(what, keys);
    return row;
  }));
}

const NOTE = {
  granted: 'Browser notifications are on: a permission request or a finished turn in a background tab notifies you.',
  denied: 'Browser notifications are blocked for this site; the tab title still counts what happened while it was in the background. Allow them in the site settings to be notified.',
  default: 'Browser notifications are off: the tab title counts what happened while it was in the background.',
  unsupported: 'This browser shows no notifications for this page; the tab title counts what happened while it was in the background.',
};

function renderNotificationNote() {
  const state = notificationState();
  const note = $('notifications-note');
  if (note) note.textContent = NOTE[state] ?? NOTE.default;
  const enable = $('notifications-enable');
  if (enable) enable.hidden = state !== 'default';
}

function openHelp() {
  const dialog = $('shortcuts-dialog');
  if (!dialog || dialog.open || modalOpen()) return;
  renderNotificationNote();
  dialog.showModal();
}
