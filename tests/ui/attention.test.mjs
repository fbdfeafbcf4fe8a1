// Attention and layout in Chromium against the real gateway (issue 11 items 4 and 5):
// - a tab in the background gets a notification and a "(N) …" title badge for a finished turn
//   and for a permission request; clicking the notification opens the session with the card;
// - two tabs of one user: a session created / prompted / deleted in one shows in the other, a
//   permission answered in one disappears from the other (the gateway's `$/cancel_request`);
// - keyboard shortcuts, the "?" dialog, the phone drawer (focus in and back, Escape, inert
//   background, no horizontal scroll), dark mode screenshots.
//
// Background tabs: headless Chromium keeps every tab 'visible' (bringToFront and minimizing the
// window leave document.visibilityState alone; tried with Chromium 156), so each tab is brought
// to the front for real and the tabs behind it are told they are hidden: an init script
// overrides document.visibilityState / document.hidden and fires `visibilitychange`.
// Notifications: the context grants 'notifications'; an init script wraps window.Notification to
// record what the page shows, and reports the permission as 'default' until the page asks for it,
// so the test sees when (and from which gesture) it asks.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, scenario, startGateway, waitUntil } from './harness.mjs';

/** Runs in every page before its scripts: records notifications, lets the test hide the tab. */
function instrument() {
  const Real = window.Notification;
  const notes = [];
  const asks = [];
  let asked = false;
  class Recorded extends Real {
    constructor(title, options = {}) {
      super(title, options);
      notes.push({ note: this, title, body: options.body ?? '', tag: options.tag ?? '', closed: false });
      const entry = notes[notes.length - 1];
      const close = this.close.bind(this);
      this.close = () => { entry.closed = true; close(); };
    }
  }
  Object.defineProperty(Recorded, 'permission', { get: () => (asked ? Real.permission : 'default') });
  Recorded.requestPermission = () => {
    asks.push({ userActivation: navigator.userActivation?.isActive ?? null });
    asked = true;
    return Real.requestPermission();
  };
  window.Notification = Recorded;

  let hidden = false;
  Object.defineProperty(Document.prototype, 'visibilityState', { configurable: true, get: () => (hidden ? 'hidden' : 'visible') });
  Object.defineProperty(Document.prototype, 'hidden', { configurable: true, get: () => hidden });
  window.__test = {
    notes: () => notes.map(({ title, body, tag, closed }) => ({ title, body, tag, closed })),
    asks: () => asks.slice(),
    click(i) { notes[i].note.onclick?.(new Event('click')); },
    setHidden(on) {
      if (hidden === on) return;
      hidden = on;
      document.dispatchEvent(new Event('visibilitychange'));
    },
  };
}

describe('attention, tabs and layout', { timeout: 240_000 }, () => {
  let gw;
  let b;
  let v; // the desktop context: tabs A and B
  let a;
  let bTab;

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--delay-us', '2000', '--chunks', '3'] });
    b = await openBrowser();
    v = await b.open(gw, { ...DESKTOP, permissions: ['notifications'], goto: false });
    await v.context.addInitScript(instrument);
    a = v.page;
    await a.goto(`${gw.base}/`);
    await connected(a);
  });

  after(async () => {
    await b?.close().catch(() => {});
    if (gw) {
      const { status, leaked } = await gw.dispose();
      assert.deepEqual(leaked, []);
      assert.deepEqual(status, { code: 0, signal: null });
    }
  });

  // One scenario: after a failure the rest are skipped.
  const step = scenario(async () => {
    await v?.shot('attention-failure');
    process.stderr.write(`--- gateway log ---\n${gw.log()}\n`);
  });

  /** Brings `page` to the front; every other tab of the context is told it is hidden. */
  async function focusTab(page) {
    await page.bringToFront();
    for (const other of v.context.pages()) {
      await other.evaluate((on) => window.__test.setHidden(on), other !== page);
    }
  }
  const notes = (page) => page.evaluate(() => window.__test.notes());
  const title = (page) => page.title();
  const item = (page, id) => page.locator(`[data-testid="session-item"][data-session-id="${id}"]`);
  const sendButtonBack = (page) => page.getByTestId('send').waitFor();
  let sessionId;

  step('asks for notifications on the first prompt, from its gesture, never at load', async () => {
    assert.deepEqual(await a.evaluate(() => window.__test.asks()), [], 'asked at page load');
    await a.getByTestId('prompt-input').fill('first prompt');
    await a.getByTestId('send').click();
    await a.getByTestId('message-agent').filter({ hasText: 'chunk 3/3' }).waitFor();
    await sendButtonBack(a);
    assert.deepEqual(await a.evaluate(() => window.__test.asks()), [{ userActivation: true }]);
    assert.equal(await a.evaluate(() => Notification.permission), 'granted');
    sessionId = await a.getByTestId('session-item').first().getAttribute('data-session-id');
    assert.ok(sessionId);
    // The tab is visible: no notification, no badge.
    assert.deepEqual(await notes(a), []);
    assert.equal(await title(a), 'first prompt · ACP Gateway');
  });

  step('a second tab sees the session, and a session it creates shows in the first', async () => {
    bTab = await v.newPage(); // not navigated: the context was opened with goto: false
    await bTab.goto(`${gw.base}/`);
    await connected(bTab);
    await focusTab(bTab);
    await item(bTab, sessionId).waitFor();
    // B creates a session: A's list gets it at the top without a reload.
    await bTab.getByTestId('new-session').click();
    await waitUntil('B to open its new session', async () => (await bTab.getByTestId('session-item').count()) === 2, { ms: 15_000 });
    const created = await bTab.locator('[data-testid="session-item"] [aria-current="true"]').locator('xpath=..').getAttribute('data-session-id');
    await item(a, created).waitFor();
    assert.equal(await a.getByTestId('session-item').first().getAttribute('data-session-id'), created, 'the new session is on top in A');
    // B prompts in it: its title and its place on top reach A.
    await bTab.getByTestId('prompt-input').fill('made in tab B');
    await bTab.getByTestId('prompt-input').press('Enter');
    await bTab.getByTestId('message-agent').filter({ hasText: 'chunk 3/3: you said: made in tab B' }).waitFor();
    await item(a, created).filter({ hasText: 'made in tab B' }).waitFor();
    // The agent renames it (session_info_update reaches B's socket only: A never opened it).
    await bTab.getByTestId('prompt-input').fill('now rename it [title=Renamed in B]');
    await bTab.getByTestId('prompt-input').press('Enter');
    await item(bTab, created).filter({ hasText: 'Renamed in B' }).waitFor();
    await item(a, created).filter({ hasText: 'Renamed in B' }).waitFor();
    await sendButtonBack(bTab);
    // …and deleting it in B removes it from A.
    bTab.once('dialog', (d) => d.accept());
    await item(bTab, created).hover();
    await item(bTab, created).getByTestId('session-delete').click();
    await item(a, created).waitFor({ state: 'detached' });
    await item(bTab, created).waitFor({ state: 'detached' });
    assert.deepEqual(await notes(a), [], 'nothing here is news for the user');
  });

  step('a turn that finishes in a background tab notifies and badges the title', async () => {
    await focusTab(a);
    await item(a, sessionId).locator('.session-open').click();
    await a.getByTestId('prompt-input').fill('take your time [delay_us=150000] [chunks=6]');
    await a.getByTestId('prompt-input').press('Enter');
    await a.getByTestId('stop').waitFor();
    await focusTab(bTab); // the user looks at the other tab while A works
    await sendButtonBack(a);
    await waitUntil('a notification in A', async () => (await notes(a)).length === 1, { ms: 5_000 });
    const [note] = await notes(a);
    assert.equal(note.title, 'The agent finished its turn');
    assert.equal(note.body, 'first prompt');
    assert.equal(note.tag, `acp-gateway:${sessionId}`);
    assert.equal(await title(a), '(1) first prompt · ACP Gateway');
    assert.deepEqual(await notes(bTab), [], 'the visible tab B was not notified');
    // Looking at A again clears the badge and closes its notification.
    await focusTab(a);
    assert.equal(await title(a), 'first prompt · ACP Gateway');
    assert.equal((await notes(a))[0].closed, true);
  });

  step('a permission request in a background tab notifies; clicking it opens the session with the card', async () => {
    // A looks at a new, empty session; B (in front) prompts in the first one, which A also has open.
    await a.getByTestId('new-session').click();
    await waitUntil('A on its new session', async () => (await a.getByTestId('session-title').textContent()) === 'Untitled session');
    await focusTab(bTab);
    await item(bTab, sessionId).locator('.session-open').click();
    await bTab.getByTestId('message-user').filter({ hasText: 'first prompt' }).waitFor();
    await bTab.getByTestId('prompt-input').fill('may I? [permission]');
    await bTab.getByTestId('prompt-input').press('Enter');
    // Both tabs are asked: B shows the card (no notification: it is visible) …
    await bTab.getByTestId('permission').waitFor();
    // … and A, in the background, shows it too, with a notification and a badge.
    await a.getByTestId('permission').waitFor();
    assert.match(await a.getByTestId('permission').textContent(), /Read the workspace.*\(in “first prompt”\)/);
    await waitUntil('a permission notification in A', async () => (await notes(a)).length === 2, { ms: 5_000 });
    const note = (await notes(a))[1];
    assert.equal(note.title, 'Permission requested');
    assert.equal(note.body, 'Read the workspace — first prompt');
    assert.equal(note.tag, `acp-gateway:${sessionId}`, 'tagged by session: it replaces the earlier one');
    assert.equal(await title(a), '(1) Untitled session · ACP Gateway');
    assert.deepEqual(await notes(bTab), []);
    await v.shot('attention-permission-other-tab', bTab);

    // The user clicks A's notification: A comes to the front on that session, the card in view.
    await a.bringToFront();
    await a.evaluate(() => window.__test.click(1));
    await a.evaluate(() => window.__test.setHidden(false));
    await bTab.evaluate(() => window.__test.setHidden(true));
    await waitUntil('A to open the session', async () => (await a.getByTestId('session-title').textContent()) === 'first prompt');
    await a.getByTestId('message-user').filter({ hasText: 'may I?' }).waitFor();
    assert.equal(await title(a), 'first prompt · ACP Gateway');
    assert.equal((await notes(a))[1].closed, true);
    assert.doesNotMatch(await a.getByTestId('permission').textContent(), /\(in /, 'the card is about the open session now');
    const focused = await a.evaluate(() => document.activeElement?.closest('[data-testid="permission"]') != null);
    assert.ok(focused, 'focus is on the permission card');
    assert.ok(await a.getByTestId('permission').isVisible());
    await v.shot('attention-permission');

    // Answered in A: B's card goes (the gateway tells B with $/cancel_request), the turn goes on.
    await a.getByTestId('permission-option').and(a.locator('[class*="kind-allow"]')).first().click();
    await bTab.getByTestId('permission').waitFor({ state: 'detached' });
    await a.getByTestId('message-agent').filter({ hasText: 'chunk 3/3: allowed; you said: may I?' }).waitFor();
    // The conversation reached B through its own socket.
    await bTab.getByTestId('message-agent').filter({ hasText: 'chunk 3/3: allowed; you said: may I?' }).waitFor();
    assert.equal(await bTab.getByTestId('message-user').filter({ hasText: 'may I?' }).count(), 1);
    await sendButtonBack(bTab);
  });

  step('keyboard shortcuts: new session, search, prompt, sidebar, stop, help', async () => {
    await focusTab(a);
    const active = () => a.evaluate(() => document.activeElement?.id ?? '');
    // Shown in tooltips and aria-keyshortcuts.
    assert.equal(await a.getByTestId('new-session').getAttribute('aria-keyshortcuts'), 'Alt+N');
    assert.match(await a.getByTestId('new-session').getAttribute('title'), /Alt\+N/);
    assert.equal(await a.getByTestId('session-search').getAttribute('aria-keyshortcuts'), 'Control+K /');

    const before = await a.getByTestId('session-item').count();
    await a.keyboard.press('Alt+N');
    await waitUntil('Alt+N to create a session', async () => (await a.getByTestId('session-item').count()) === before + 1);
    assert.equal(await a.getByTestId('session-title').textContent(), 'Untitled session');
    await waitUntil('focus in the prompt box', async () => (await active()) === 'prompt-input');

    await a.keyboard.press('Control+K');
    assert.equal(await active(), 'session-search');
    await a.keyboard.press('Alt+P');
    assert.equal(await active(), 'prompt-input');
    await a.keyboard.type('/'); // typing: "/" is text, not a shortcut
    assert.equal(await a.getByTestId('prompt-input').inputValue(), '/');
    await a.getByTestId('prompt-input').fill('');
    await a.getByTestId('conversation').focus();
    await a.keyboard.press('/');
    assert.equal(await active(), 'session-search');

    // Alt+L hides and shows the sidebar on a wide screen.
    await a.keyboard.press('Alt+L');
    await a.locator('#sidebar').waitFor({ state: 'hidden' });
    assert.equal(await a.getByTestId('sidebar-toggle').getAttribute('aria-expanded'), 'false');
    await v.shot('layout-desktop-collapsed');
    await a.keyboard.press('Alt+L');
    await a.locator('#sidebar').waitFor();
    assert.equal(await a.getByTestId('sidebar-toggle').getAttribute('aria-expanded'), 'true');

    // Stop: Escape (outside text fields too) and Alt+. cancel the running turn.
    const stopped = a.locator('.note', { hasText: 'Stopped: cancelled' });
    for (const [i, key] of ['Escape', 'Alt+Period'].entries()) {
      await a.getByTestId('prompt-input').fill(`wait for me [hang] ${key}`);
      await a.getByTestId('prompt-input').press('Enter');
      await a.getByTestId('stop').waitFor();
      await a.getByTestId('conversation').focus();
      await a.keyboard.press(key);
      await sendButtonBack(a);
      await waitUntil(`${key} to stop the turn`, async () => (await stopped.count()) === i + 1);
    }
    // A finished turn while visible: still no notification (two so far, both from the background).
    assert.equal((await notes(a)).length, 2);

    // "?" opens the help dialog; Escape closes it and focus goes back.
    await a.getByTestId('conversation').focus();
    await a.keyboard.press('Shift+Slash');
    const dialog = a.getByTestId('shortcuts-dialog');
    await dialog.waitFor();
    assert.match(await dialog.textContent(), /New session.*Alt\+N/s);
    assert.match(await a.getByTestId('notifications-note').textContent(), /notifications are on/);
    await v.shot('attention-shortcuts-dialog');
    // While a modal dialog is open the page behind it takes no shortcuts.
    const sessions = await a.getByTestId('session-item').count();
    await a.keyboard.press('Alt+N');
    await a.keyboard.press('Control+K');
    assert.notEqual(await active(), 'session-search', 'Ctrl+K reached the page behind the dialog');
    assert.ok(await dialog.isVisible());
    assert.equal(await a.getByTestId('session-item').count(), sessions);
    await a.keyboard.press('Escape');
    await dialog.waitFor({ state: 'hidden' });
    assert.equal(await active(), 'log');
    assert.deepEqual(v.errors(), NO_ERRORS);
  });

  step('keyboard: the skip link comes first, focus follows the layout, every stop shows a ring', async (t) => {
    await focusTab(a);
    const skip = a.locator('#skip-link');
    // The first tabbable element of the app, in document order, is the skip link.
    const first = await a.evaluate(() => [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
      .find((el) => el.tabIndex >= 0 && !el.disabled && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden')?.id);
    assert.equal(first, 'skip-link');
    await skip.focus();
    const box = await skip.boundingBox();
    assert.ok(box && box.y >= 0 && box.height > 0, 'the focused skip link is on screen');
    await v.shot('layout-skip-link');
    // Tab through: every stop has a visible focus ring; the sidebar comes before the conversation.
    const stops = [];
    for (let i = 0; i < 40; i++) {
      await a.keyboard.press('Tab');
      const stop = await a.evaluate(() => {
        const el = document.activeElement;
        const style = getComputedStyle(el);
        return {
          name: el.id || el.dataset.testid || el.className || el.tagName,
          ring: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0,
          inSidebar: !!el.closest('#sidebar'),
        };
      });
      if (stop.name === 'prompt-input') break;
      stops.push(stop);
    }
    t.diagnostic(`focus order: skip-link → ${stops.map((s) => s.name).join(' → ')} → prompt-input`);
    assert.deepEqual(stops.filter((s) => !s.ring), [], 'focus stops without a visible ring');
    const firstMain = stops.findIndex((s) => !s.inSidebar);
    assert.ok(firstMain > 0 && stops.slice(firstMain).every((s) => !s.inSidebar), `focus order: ${stops.map((s) => s.name).join(' → ')}`);
    assert.ok(stops.some((s) => s.name === 'log'), 'the conversation is a focus stop (it scrolls)');
    // The skip link lands on the conversation's column.
    await skip.focus();
    await a.keyboard.press('Enter');
    assert.equal(await a.evaluate(() => document.activeElement?.id), 'main');
  });

  step('phone: the drawer takes focus, makes the rest inert, closes with Escape; no horizontal scroll', async () => {
    for (const colorScheme of ['light', 'dark']) {
      const p = await b.open(gw, { ...PHONE, colorScheme });
      try {
        const page = p.page;
        await connected(page);
        await item(page, sessionId).waitFor({ state: 'attached' });
        const scrollWidth = () => page.evaluate(() => document.documentElement.scrollWidth);
        assert.equal(await scrollWidth(), 390);
        assert.equal(await page.locator('#sidebar').isVisible(), false, 'the closed drawer is hidden');
        const toggle = page.getByTestId('sidebar-toggle');
        await toggle.click();
        await page.getByTestId('sidebar-close').waitFor();
        await waitUntil('focus in the drawer', () => page.evaluate(() => document.activeElement?.id === 'sidebar-close'));
        assert.equal(await toggle.getAttribute('aria-expanded'), 'true');
        assert.equal(await page.evaluate(() => document.getElementById('main').inert), true);
        await page.waitForTimeout(300); // the slide-in transition, for the screenshot only
        await p.shot(colorScheme === 'dark' ? 'dark-phone-drawer' : 'layout-phone-drawer');
        await page.keyboard.press('Escape');
        await page.locator('#sidebar').waitFor({ state: 'hidden' });
        assert.equal(await page.evaluate(() => document.activeElement?.id), 'sidebar-toggle');
        assert.equal(await page.evaluate(() => document.getElementById('main').inert), false);
        // Opening a session from the drawer closes it.
        await toggle.click();
        await item(page, sessionId).locator('.session-open').click();
        await page.locator('#sidebar').waitFor({ state: 'hidden' });
        await page.getByTestId('message-agent').filter({ hasText: 'chunk 3/3: allowed; you said: may I?' }).waitFor();
        assert.equal(await scrollWidth(), 390, 'a conversation scrolls sideways');
        // Topbar and composer controls are thumb-sized.
        for (const id of ['sidebar-toggle', 'shortcuts-button', 'send']) {
          const box = await page.getByTestId(id).boundingBox();
          assert.ok(box.height >= 44 && box.width >= 44, `${id} is ${box.width}x${box.height}`);
        }
        await p.shot(colorScheme === 'dark' ? 'dark-phone-conversation' : 'layout-phone-conversation');
        await page.getByTestId('prompt-input').fill(`on the phone [permission] ${colorScheme}`);
        await page.getByTestId('send').click();
        await page.getByTestId('permission').waitFor();
        assert.equal(await scrollWidth(), 390);
        await p.shot(colorScheme === 'dark' ? 'dark-phone-permission' : 'attention-phone-permission');
        await page.getByTestId('permission-option').first().click();
        await page.getByTestId('send').waitFor();
        assert.deepEqual(p.errors(), NO_ERRORS);
      } finally {
        await p.close();
      }
    }
  });

  step('dark mode follows the system: desktop screenshots', async () => {
    const d = await b.open(gw, { ...DESKTOP, colorScheme: 'dark' });
    try {
      const page = d.page;
      await connected(page);
      await item(page, sessionId).locator('.session-open').click();
      await page.getByTestId('message-agent').filter({ hasText: 'chunk 3/3: allowed; you said: may I?' }).waitFor();
      const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
      assert.notEqual(bg, 'rgb(246, 247, 249)', 'the light background in dark mode');
      await d.shot('dark-desktop-conversation');
      await page.getByTestId('prompt-input').fill('dark permission [permission]');
      await page.getByTestId('prompt-input').press('Enter');
      await page.getByTestId('permission').waitFor();
      await d.shot('dark-desktop-permission');
      await page.getByTestId('permission-option').first().click();
      await page.getByTestId('send').waitFor();
      await page.getByTestId('shortcuts-button').click();
      await page.getByTestId('shortcuts-dialog').waitFor();
      await d.shot('dark-desktop-shortcuts');
      await page.keyboard.press('Escape');
      assert.deepEqual(d.errors(), NO_ERRORS);
    } finally {
      await d.close();
    }
  });

  step('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(v.errors(), NO_ERRORS);
  }, { always: true });
});
