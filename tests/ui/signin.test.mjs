// Signing an agent in with the user's own key, in Chromium against the real gateway: an agent that
// behaves like codex-acp (tests/agents/keys_agent.py: an `env_var` method for OPENAI_API_KEY beside
// an `agent` method, and -32000 to a prompt until it has the key). The user types a prompt; the
// agent refuses it; the sign-in card offers the key form; once the key is saved the prompt the
// user typed is sent again and answered. The key is never shown again (only "set"), no route
// returns it, and Sign out removes it.
//
// Run: `cargo build && cd tests/ui && node --test signin.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { NO_ERRORS, REPO, connected, openBrowser, scenario, startGateway } from './harness.mjs';

const KEYS_AGENT = path.join(REPO, 'tests/agents/keys_agent.py');
const KEY = 'sk-browser-secret-value-7421';
const PROMPT = 'hello, are you signed in?';

describe('signing an agent in with a key, in the browser', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let view;
  let page;
  const byId = (id) => page.locator(`[data-testid="${id}"]`);

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${KEYS_AGENT}` });
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
    await view.shot('failure-signin');
    process.stdout.write(gw.log());
  });

  step('a refused prompt offers the agent\'s methods, and the typed text stays', async () => {
    await byId('prompt-input').fill(PROMPT);
    await byId('send').click();
    const card = byId('agent-auth');
    await card.waitFor();
    assert.match(await card.textContent(), /Authentication required/);
    assert.equal(await card.locator('li[data-type="env_var"]').count(), 1);
    assert.equal(await card.locator('li[data-type="agent"]').count(), 2, 'the agent\'s own methods too');
    assert.equal(await byId('prompt-input').inputValue(), PROMPT, 'the prompt is not lost');
    await view.shot('agent-key-form');
  });

  step('the key is saved, and the prompt the user typed is sent again and answered', async () => {
    const input = page.locator('[data-testid="auth-var"][data-var="OPENAI_API_KEY"]');
    assert.equal(await input.getAttribute('type'), 'password');
    await input.fill(KEY);
    await page.locator('[data-testid="auth-env-form"] [data-testid="auth-method"]').click();
    await byId('agent-auth').waitFor({ state: 'detached' });
    await page.locator('[data-testid="message-agent"]', { hasText: 'signed in with a key ending 7421' }).waitFor();
    assert.equal(await byId('prompt-input').inputValue(), '', 'the prompt went');
  });

  step('the key is shown as set, never returned, and sign-out removes it', async () => {
    const body = await (await page.request.get(`${gw.base}/api/agents`)).text();
    assert.ok(!body.includes(KEY), 'no route returns the key');
    assert.equal(JSON.parse(body).agents[0].keys[0].name, 'OPENAI_API_KEY');
    assert.ok(!(await page.content()).includes(KEY), 'the page keeps no copy of it');

    await byId('agent-signin').click();
    const card = byId('agent-auth');
    await card.waitFor();
    await byId('auth-var-set').waitFor();
    await byId('agent-sign-out').click();
    await card.waitFor({ state: 'detached' });
    await page.locator('.note', { hasText: 'Signed out of the agent' }).waitFor();
    const after = await (await page.request.get(`${gw.base}/api/agents`)).json();
    assert.deepEqual(after.agents[0].keys, []);
    // The agent no longer has it: the next prompt is refused again.
    await byId('prompt-input').fill('and now?');
    await byId('send').click();
    await byId('agent-auth').waitFor();
  });

  step('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(view.errors(), NO_ERRORS);
  });
});

// A terminal sign-in (claude-agent-acp's `claude /login` kind), end to end: the agent refuses the
// prompt the user typed (-32000) and says "not signed in" to the draft `auth/status`; the card's
// button opens the terminal page, where the agent's login program
// (tests/agents/terminal_login_agent.py) runs for this user in an xterm.js terminal; the user
// types the code it asks for; it exits 0 having written a file in HOME, the card in the first page
// goes, the typed prompt runs, and the badge says "signed in".
describe('a terminal sign-in in the browser', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let view;
  let page;
  let popup;
  const popupErrors = [];
  const byId = (id) => page.locator(`[data-testid="${id}"]`);

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${path.join(REPO, 'tests/agents/terminal_login_agent.py')}` });
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
    await view.shot('failure-signin-terminal');
    if (popup) await popup.screenshot({ path: path.join(REPO, 'tests/ui/screenshots/failure-signin-terminal-page.png') }).catch(() => {});
    process.stdout.write(gw.log());
  });

  step('a refused prompt\'s card opens the terminal page, where the login program asks for a code', async () => {
    await page.locator('[data-testid="agent-auth-state"][data-state="out"]', { hasText: 'not signed in' }).waitFor();
    await byId('prompt-input').fill('who am I?');
    await byId('send').click();
    await byId('agent-auth').waitFor();
    assert.match(await byId('agent-auth').textContent(), /Authentication required/);
    const button = page.locator('[data-testid="auth-method"][data-method-id="login"]');
    await button.waitFor();
    const opened = page.context().waitForEvent('page');
    await button.click();
    popup = await opened;
    popup.on('pageerror', (err) => popupErrors.push(String(err)));
    popup.on('console', (msg) => { if (msg.type() === 'error') popupErrors.push(msg.text()); });
    await popup.locator('[data-testid="terminal-status"][data-state="running"]').waitFor();
    await popup.locator('.xterm-rows', { hasText: 'Paste code:' }).waitFor();
    await popup.screenshot({ path: path.join(REPO, 'tests/ui/screenshots/signin-terminal.png') });
  });

  step('the code typed in the terminal signs this user in, and the first page says so', async () => {
    await popup.locator('.xterm-helper-textarea').focus();
    await popup.keyboard.type('browser-code');
    await popup.keyboard.press('Enter');
    await popup.locator('[data-testid="terminal-status"][data-state="ok"]').waitFor();
    await byId('agent-auth').waitFor({ state: 'detached' });
    await page.locator('.note', { hasText: 'Signed in to the agent with Log in.' }).waitFor();
    await page.locator('[data-testid="message-agent"]', { hasText: 'signed in as browser-code' }).waitFor();
    await page.locator('[data-testid="agent-auth-state"][data-state="in"]').waitFor();
    const agents = await (await page.request.get(`${gw.base}/api/agents`)).json();
    assert.equal(agents.agents[0].login.methodId, 'login');
    const { readFileSync } = await import('node:fs');
    assert.equal(readFileSync(path.join(gw.tmp, 'homes', 'local', '.login-ok'), 'utf8').trim(), 'browser-code');
    assert.deepEqual(popupErrors, []);
    assert.deepEqual(view.errors(), NO_ERRORS);
  });
});
