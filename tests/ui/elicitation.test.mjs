// The agent asks the user something (ACP `elicitation/create`), in Chromium against the real
// gateway with an agent that asks (tests/agents/elicit_agent.py): the question reaches both tabs
// that show the session, like a permission request; the first answer wins and the other tab's
// card is withdrawn. A form is built from the schema and checked before it is sent; a URL is shown
// and never opened by itself.
//
// Run: `cargo build && cd tests/ui && node --test elicitation.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { NO_ERRORS, REPO, connected, openBrowser, scenario, startGateway } from './harness.mjs';

describe('the agent asks the user something, in two tabs', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let view;
  let a;
  let b;
  let sessionId;

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${path.join(REPO, 'tests/agents/elicit_agent.py')}` });
    browser = await openBrowser();
    view = await browser.open(gw);
    a = view.page;
    await connected(a);
  });

  after(async () => {
    await browser?.close().catch(() => {});
    await gw?.dispose();
  });

  const step = scenario(async () => {
    await view.shot('failure-elicitation');
    process.stdout.write(gw.log());
  });

  const reply = (page, text) => page.getByTestId('message-agent').filter({ hasText: text });

  step('two tabs show one session', async () => {
    await a.getByTestId('prompt-input').fill('hello');
    await a.getByTestId('prompt-input').press('Enter');
    await reply(a, 'you said: hello').waitFor();
    sessionId = await a.locator('[data-testid="session-item"] [aria-current="true"]').locator('xpath=..').getAttribute('data-session-id');
    assert.ok(sessionId);
    b = await view.newPage();
    await connected(b);
    await b.locator(`[data-testid="session-item"][data-session-id="${sessionId}"]`).click();
    await reply(b, 'you said: hello').waitFor();
  });

  step('a form reaches both tabs; answered in one, it is withdrawn from the other', async () => {
    await a.getByTestId('prompt-input').fill('form');
    await a.getByTestId('prompt-input').press('Enter');
    const inA = a.getByTestId('elicitation');
    const inB = b.getByTestId('elicitation');
    await inA.waitFor();
    await inB.waitFor();
    assert.match(await inB.textContent(), /Where should this deploy\?/);
    // The browser's own checks first: the required integer is missing, so nothing is sent.
    await inB.locator('[data-name="env"]').selectOption('production');
    await inB.getByTestId('elicit-accept').click();
    assert.equal(await inA.count(), 1, 'an invalid form is not sent');
    await inB.locator('[data-name="replicas"]').fill('9');
    await inB.getByTestId('elicit-accept').click();
    assert.equal(await inA.count(), 1, 'over the maximum is not sent either');
    await inB.locator('[data-name="replicas"]').fill('3');
    await inB.locator('[data-name="confirm"]').check();
    await view.shot('elicitation-form', b);
    await inB.getByTestId('elicit-accept').click();
    await inA.waitFor({ state: 'detached' });
    await inB.waitFor({ state: 'detached' });
    await reply(a, 'answer: {"action": "accept", "content": {"confirm": true, "env": "production", "replicas": 3}}').waitFor();
  });

  step('a URL is shown, not opened by itself; declined in one tab, withdrawn from the other', async () => {
    const pages = view.context.pages().length;
    await a.getByTestId('prompt-input').fill('url');
    await a.getByTestId('prompt-input').press('Enter');
    const inA = a.getByTestId('elicitation');
    const inB = b.getByTestId('elicitation');
    await inA.waitFor();
    await inB.waitFor();
    assert.equal(await inA.getByTestId('elicit-url').textContent(), 'https://example.com/device?code=ABCD-1234');
    assert.equal(view.context.pages().length, pages, 'no page was opened');
    await inA.getByTestId('elicit-decline').click();
    await inB.waitFor({ state: 'detached' });
    await reply(a, 'answer: {"action": "decline"}').waitFor();
  });

  step('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(view.errors(), NO_ERRORS);
  });
});
