// The agent's own sign-in methods (`agent` type, codex's `chatgpt`) in Chromium against the real
// gateway, with tests/agents/keys_agent.py: a refusal is shown verbatim; a device login shows the
// URL and code the agent gives meanwhile (as a link the user clicks, never opened for them), and
// when the person has approved it the prompt they typed runs; the badge beside the Sign in button
// says "signed in"; sign-out runs the agent's logout. Then the stored session opens signed out
// (replayed by the gateway), and the agent's refusal to restore it for the next prompt (-32000 to
// session/load) offers the card; after the sign-in that prompt runs.
//
// Run: `cargo build && cd tests/ui && node --test signin-agent.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { NO_ERRORS, REPO, connected, openBrowser, scenario, startGateway, waitUntil } from './harness.mjs';

const KEYS_AGENT = path.join(REPO, 'tests/agents/keys_agent.py');
const PROMPT = 'what can you do?';

describe('an agent\'s own sign-in in the browser', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let view;
  let page;
  let sessionId;
  const byId = (id) => page.locator(`[data-testid="${id}"]`);
  const home = (file) => path.join(gw.tmp, 'homes', 'local', file);
  const method = (id) => page.locator(`[data-testid="auth-method"][data-method-id="${id}"]`);

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${KEYS_AGENT} --load-needs-login` });
    browser = await openBrowser();
    view = await browser.open(gw);
    page = view.page;
    await connected(page);
  });

  after(async () => {
    await browser?.close().catch(() => {});
    await gw?.dispose();
  });

  const step = scenario(async () => {
    await view.shot('failure-signin-agent');
    process.stdout.write(gw.log());
  });

  step('a refusal is shown as the agent said it', async () => {
    assert.equal(await byId('agent-auth-state').isHidden(), true, 'nothing known yet');
    await byId('agent-signin').click();
    await method('sso').click();
    await page.locator('[data-testid="agent-auth-status"][data-state="failed"]',
      { hasText: 'Sign-in failed: SSO is not enabled for this workspace (code -32000)' }).waitFor();
    assert.match(await byId('agent-auth').textContent(), /single sign-on through your company/, 'with the method\'s description');
    await byId('agent-auth').getByRole('button', { name: 'Close' }).click();
  });

  step('a device login shows its URL and code, and the prompt the user typed then runs', async () => {
    await byId('prompt-input').fill(PROMPT);
    await byId('send').click();
    await byId('agent-auth').waitFor();
    await method('chatgpt').click();
    const note = page.locator('[data-testid="agent-auth-note"]', { hasText: 'Open https://auth.example.test/device and enter code WXYZ-1234' });
    await note.waitFor();
    await page.locator('[data-testid="agent-auth-note"]', { hasText: 'userCode: WXYZ-1234' }).waitFor();
    const link = note.locator('[data-testid="agent-auth-link"]');
    assert.equal(await link.getAttribute('href'), 'https://auth.example.test/device');
    assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
    assert.equal(page.context().pages().length, 1, 'the URL is not opened for the user');
    assert.doesNotMatch(await byId('agent-auth').textContent(), /debug: polling/, 'the rest of stderr stays in the logs');
    await view.shot('agent-device-login');
    // The person approves the device elsewhere; the agent's poll sees it.
    writeFileSync(home('device-approved'), 'yes');
    await byId('agent-auth').waitFor({ state: 'detached' });
    await page.locator('[data-testid="message-agent"]', { hasText: 'signed in with ChatGPT' }).waitFor();
    assert.equal(await byId('prompt-input').inputValue(), '', 'the prompt went');
    await page.locator('[data-testid="agent-auth-state"][data-state="in"]', { hasText: 'signed in' }).waitFor();
    sessionId = await page.locator('[data-testid="session-item"] [aria-current="true"]').locator('xpath=..').getAttribute('data-session-id');
    assert.ok(sessionId);
  });

  step('sign-out runs the agent\'s logout and forgets the login', async () => {
    await byId('agent-signin').click();
    await byId('agent-auth-login').waitFor();
    await byId('agent-sign-out').click();
    await page.locator('.note', { hasText: 'Signed out of the agent.' }).waitFor();
    await byId('agent-auth-state').waitFor({ state: 'hidden' });
    assert.ok(existsSync(home('keys-agent-logged-out')), 'the agent\'s logout ran');
    const agents = await (await page.request.get(`${gw.base}/api/agents`)).json();
    assert.equal(agents.agents[0].login, null);
  });

  step('a stored session opens signed out; the agent refusing to restore it offers the card, and the prompt runs after', async () => {
    await page.reload();
    await connected(page);
    await page.locator(`[data-testid="session-item"][data-session-id="${sessionId}"] .session-open`).click();
    // Replayed from the store (the agent is not asked): the refused prompt and the one that ran
    // are two messages, not one.
    await page.locator('[data-testid="message-agent"]', { hasText: 'signed in with ChatGPT' }).waitFor();
    assert.deepEqual((await page.locator('[data-testid="message-user"]').allTextContents()).map((t) => t.trim()), [PROMPT, PROMPT]);
    // The next prompt needs the session restored on a new process, which the agent refuses.
    await byId('prompt-input').fill('and again?');
    await byId('send').click();
    await byId('agent-auth').waitFor();
    assert.match(await byId('agent-auth').textContent(), /Authentication required/);
    rmSync(home('device-approved'), { force: true });
    await method('chatgpt').click();
    await page.locator('[data-testid="agent-auth-note"]', { hasText: 'WXYZ-1234' }).first().waitFor();
    writeFileSync(home('device-approved'), 'yes');
    await byId('agent-auth').waitFor({ state: 'detached' });
    await page.locator('[data-testid="message-user"]', { hasText: 'and again?' }).first().waitFor();
    await waitUntil('the retried prompt to be answered', async () =>
      (await page.locator('[data-testid="message-agent"]', { hasText: 'signed in with ChatGPT' }).count()) === 2);
  });

  step('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(view.errors(), NO_ERRORS);
  });
});
