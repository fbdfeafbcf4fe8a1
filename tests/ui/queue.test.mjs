// Messages typed mid-turn (issue 20, item 3): while the agent works (its turn held open here by
// a permission request), the prompt box stays usable and Enter queues the message; the gateway
// keeps the queue, so a second tab of the same user sees it, can add to it, and what one tab
// edits or removes the other shows. When the turn ends, the queued messages are sent in order,
// each its own turn, and stay in the transcript after a reload. Phone-sized; screenshot
// queued-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test queue.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { connected, NO_ERRORS, openBrowser, PHONE, scenario, shutdown, startGateway } from './harness.mjs';

describe('messages typed mid-turn are queued in the gateway', { timeout: 240_000 }, () => {
  let gw;
  let browser;
  let v;
  let a;
  let b;
  const step = scenario(async () => {
    await v?.shot('queue-failure', a).catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--delay-us', '0', '--chunks', '2'] });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  const queued = (page) => page.getByTestId('queued').locator('.queued-text');
  const queuedTexts = (page) => queued(page).allInnerTexts();
  const typeAndEnter = async (page, text) => {
    await page.getByTestId('prompt-input').fill(text);
    await page.getByTestId('prompt-input').press('Enter');
  };
  const openFirstSession = async (page) => {
    await page.getByTestId('sidebar-toggle').click(); // a phone shows the list in a drawer
    await page.locator('[data-testid="session-item"] .session-open').first().click();
  };
  const waitForTexts = (page, texts) => page.waitForFunction(
    (want) => JSON.stringify([...document.querySelectorAll('[data-testid="queued"] .queued-text')].map((e) => e.textContent)) === JSON.stringify(want),
    texts,
  );

  step('a message typed while the agent works is queued, not lost', async () => {
    v = await browser.open(gw, PHONE);
    a = v.page;
    await connected(a);
    await typeAndEnter(a, 'first, ask me [permission]');
    await a.getByTestId('permission').first().waitFor();
    await a.getByTestId('queue-send').waitFor();
    assert.equal(await a.getByTestId('send').isHidden(), true, 'Send becomes Queue while the turn runs');
    await typeAndEnter(a, 'second message');
    await waitForTexts(a, ['second message']);
    assert.doesNotMatch(await a.getByTestId('queued').first().innerText(), /null|undefined/);
    assert.equal(await a.getByTestId('prompt-input').inputValue(), '', 'the box is free again');
  });

  step('a second tab sees the queue, adds to it, and edits show in both', async () => {
    b = await v.newPage();
    await connected(b);
    await openFirstSession(b);
    await waitForTexts(b, ['second message']);
    await b.getByTestId('stop').waitFor(); // it knows a turn runs, though it did not start it
    await typeAndEnter(b, 'third');
    await typeAndEnter(b, 'fourth, to remove');
    await waitForTexts(a, ['second message', 'third', 'fourth, to remove']);
    await a.getByTestId('queued').nth(1).getByTestId('queued-edit-button').click();
    await a.getByTestId('queued-edit').fill('third, edited');
    await a.getByTestId('queued-save').click();
    await a.getByTestId('queued').nth(2).getByTestId('queued-remove').click();
    await waitForTexts(b, ['second message', 'third, edited']);
    await waitForTexts(a, ['second message', 'third, edited']);
    await v.shot('queued-phone', a);
  });

  step('when the turn ends they are sent in order, each its own turn', async () => {
    const allow = a.getByTestId('permission-option').and(a.locator('[class*="kind-allow"]')).first();
    await allow.click();
    for (const page of [a, b]) {
      await page.getByTestId('message-user').filter({ hasText: 'third, edited' }).waitFor();
      await page.getByTestId('queued-list').waitFor({ state: 'hidden' });
      await page.getByTestId('send').waitFor(); // no turn runs any more
    }
    const users = await b.getByTestId('message-user').allInnerTexts();
    const order = ['first, ask me', 'second message', 'third, edited'].map((t) => users.findIndex((u) => u.includes(t)));
    assert.ok(order.every((i, n) => i >= 0 && (n === 0 || i > order[n - 1])), `in order: ${JSON.stringify(users)}`);
    assert.ok(!users.some((u) => u.includes('fourth')), 'the removed one was never sent');
    const agent = await b.getByTestId('message-agent').count();
    assert.ok(agent >= 3, `three turns answered: ${agent}`);
  });

  step('they stay in the transcript after a reload', async () => {
    await a.reload();
    await connected(a);
    await openFirstSession(a);
    await a.getByTestId('message-user').filter({ hasText: 'second message' }).waitFor();
    await a.getByTestId('message-user').filter({ hasText: 'third, edited' }).waitFor();
    assert.equal(await a.getByTestId('queued-list').isHidden(), true);
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});
