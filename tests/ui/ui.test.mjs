// End-to-end test of the web UI (static/) in Debian's Chromium, driven by playwright-core,
// against the real gateway binary (target/debug/acp-gateway) with real demo-agent processes
// and a real SQLite file. Run: `cargo build && cd tests/ui && npm ci && node --test`.
// TEST_LOG=1 prints the gateway's log as it runs.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { BINARY, NO_ERRORS, SCREENSHOTS, STEP_MS, connected as socketUp, openBrowser, processesWithEnv, scenario, startGateway, waitUntil } from './harness.mjs';

const PROMPT_1 = 'hello from the browser';
const PROMPT_2 = 'please look around [permission]';
const PROMPT_3 = 'hello from a signed-in agent';

/** A raw WebSocket upgrade request to /acp without credentials: resolves to the HTTP status. */
function upgradeStatus(port) {
  return new Promise((resolve, reject) => {
    const req = http.get({
      host: '127.0.0.1', port, path: '/acp',
      headers: {
        Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13',
        'Sec-WebSocket-Key': 'dGhlIHNhbXBsZSBub25jZQ==', 'Sec-WebSocket-Protocol': 'acp',
        Origin: `http://127.0.0.1:${port}`,
      },
      timeout: STEP_MS,
    });
    req.on('upgrade', (res, socket) => { socket.destroy(); resolve(res.statusCode); });
    req.on('response', (res) => { res.resume(); resolve(res.statusCode); });
    req.on('timeout', () => req.destroy(new Error('upgrade request timed out')));
    req.on('error', reject);
  });
}

describe('web UI in Chromium against the real gateway', { timeout: 180_000 }, () => {
  let gw;
  let base;
  let token;
  let loginUrl; // the one-time link `serve` printed
  const user = 'local'; // who that link signs in
  let browser;
  let view;
  let page;
  let sessionId;

  before(async () => {
    // A second agent that needs its own login (like claude or codex): the web UI signs the user in
    // to it through its auth method.
    gw = await startGateway({
      agent: ['demo-agent', '--delay-us', '2000', '--chunks', '5'],
      config: [
        '[agents.login]',
        `command = ${JSON.stringify(BINARY)}`,
        'args = ["demo-agent", "--require-auth", "--delay-us", "2000", "--chunks", "5"]',
        '',
      ].join('\n'),
    });
    base = gw.base;
    loginUrl = gw.loginUrl;
    assert.ok(loginUrl?.startsWith(`${base}/auth/login?code=`), `unexpected login link in:\n${gw.stdout()}`);
    assert.doesNotMatch(gw.stdout(), /token=/, 'serve printed a token');
    token = await gw.token('alice');
    browser = await openBrowser();
    view = await browser.open(gw, { signedIn: false, goto: false });
    page = view.page;
    page.on('dialog', (dialog) => dialog.accept());
  });

  const stopGateway = () => gw?.stop() ?? { status: null, leaked: [] };

  after(async () => {
    // A safety net for failed runs; the last test does this and checks the outcome.
    await browser?.close().catch(() => {});
    await gw?.dispose();
  });

  // The steps below form one scenario: after a failure the rest are skipped (they would only time
  // out), the page is saved as screenshots/failure.png, and the gateway's log is printed.
  const step = scenario(async () => {
    await view?.shot('failure');
    process.stderr.write(`--- gateway log (last 64 KiB) ---\n${gw.log()}\n`);
  });

  const byId = (testid) => page.getByTestId(testid);
  const connected = () => socketUp(page);
  const agentReply = (text) => byId('message-agent').filter({ hasText: text }).first();
  const userMessage = (text) => byId('message-user').filter({ hasText: text });

  /** The user's first workspace root, as the gateway reports it. */
  const workspaceRoot = (name) => gw.workspaceRoot(name);

  step('signs in with the one-time link `serve` printed and connects the ACP socket', async () => {
    const response = await page.goto(loginUrl);
    assert.equal(new URL(page.url()).pathname, '/', `landed on ${page.url()}`);
    assert.equal(new URL(page.url()).search, '', 'the code is gone from the address bar');
    assert.equal(response.status(), 200);
    const csp = response.headers()['content-security-policy'] ?? '';
    assert.match(csp, /frame-ancestors 'none'/);
    assert.match(csp, /script-src 'self'/);
    await connected();
    assert.equal(await byId('user-name').textContent(), user);
    assert.equal(await byId('conn-status').textContent(), 'connected');
    assert.equal(await page.locator('#signin').isVisible(), false);
  });

  step('creates a session and streams a reply with a plan and a tool call', async () => {
    // New sessions start in the user's workspace root, not in `/`.
    assert.equal(await byId('cwd-input').inputValue(), workspaceRoot(user));
    await byId('new-session').click();
    await byId('session-item').first().waitFor();
    await byId('prompt-input').fill(PROMPT_1);
    await byId('send').click();

    await userMessage(PROMPT_1).waitFor();
    await agentReply(`you said: ${PROMPT_1}`).waitFor();
    await agentReply('chunk 5/5').waitFor();
    await byId('plan').waitFor();
    await byId('tool-call').first().waitFor();
    await page.locator('[data-testid="tool-call"][data-status="completed"]').first().waitFor();
    await byId('send').waitFor(); // the turn is over: Stop turned back into Send
    assert.equal(await byId('message-user').count(), 1, 'the echoed user_message_chunk was rendered twice');
    assert.equal(await page.locator('[data-testid="plan"] .plan-entry').count(), 3);

    const item = byId('session-item').filter({ hasText: PROMPT_1 });
    await item.waitFor();
    assert.equal(await byId('session-item').count(), 1);
    sessionId = await item.getAttribute('data-session-id');
    assert.match(sessionId, /^[0-9a-f-]{32,}$/i, `not an opaque id: ${sessionId}`);
    assert.equal(await byId('session-title').textContent(), PROMPT_1);

    // The server agrees: the session is stored with its title taken from the first prompt.
    await waitUntil('the session to be listed with its title', async () => {
      const list = await (await page.request.get(`${base}/api/sessions`)).json();
      return list.sessions?.length === 1 && list.sessions[0].sessionId === sessionId && list.sessions[0].title === PROMPT_1
        && list.sessions[0].cwd === workspaceRoot(user);
    }, { ms: STEP_MS });

    await view.shot('conversation');

    // The leak check in `after` finds the gateway's processes by their environment: make sure
    // that it can see the agent process serving this session.
    const agents = processesWithEnv(gw.tmp).filter((pid) => pid !== gw.child.pid);
    assert.ok(agents.length >= 1, 'no agent process found by environment: the leak check would be blind');
  });

  step('asks for permission and continues once allowed', async () => {
    await byId('prompt-input').fill(PROMPT_2);
    await byId('prompt-input').press('Enter');
    await userMessage(PROMPT_2).waitFor();

    const allow = byId('permission-option').and(page.locator('[class*="kind-allow"]')).first();
    await allow.waitFor();
    assert.match(await byId('permission').first().textContent(), /Read the workspace/);
    await view.shot('permission');
    await allow.click();

    await byId('permission').first().waitFor({ state: 'detached' });
    await agentReply(`allowed; you said: ${PROMPT_2}`).waitFor();
    await agentReply('chunk 5/5: allowed').waitFor();
    await byId('send').waitFor();
    assert.equal(await byId('message-agent').count(), 2);
  });

  step('replays the conversation from the server after a reload', async () => {
    await page.reload();
    await connected();
    const item = page.locator(`[data-testid="session-item"][data-session-id="${sessionId}"]`);
    await item.waitFor();
    assert.match(await item.textContent(), new RegExp(PROMPT_1), 'the server-side title is shown');
    // Nothing is on screen before the session is opened: what follows comes from session/load.
    assert.equal(await byId('message-user').count(), 0);

    await item.locator('.session-open').click();
    await userMessage(PROMPT_1).waitFor();
    await userMessage(PROMPT_2).waitFor();
    await agentReply(`chunk 5/5: you said: ${PROMPT_1}`).waitFor();
    await agentReply(`chunk 5/5: allowed; you said: ${PROMPT_2}`).waitFor();
    await page.locator('[data-testid="tool-call"][data-status="completed"]').nth(1).waitFor();
    await byId('plan').waitFor();
    assert.equal(await byId('message-user').count(), 2);
    assert.equal(await byId('message-agent').count(), 2);
    assert.equal(await byId('session-title').textContent(), PROMPT_1);
    await view.shot('replayed');
  });

  step('deletes the session from the sidebar', async () => {
    const item = page.locator(`[data-testid="session-item"][data-session-id="${sessionId}"]`);
    await item.hover();
    await item.getByTestId('session-delete').click(); // the confirm() dialog is accepted
    await item.waitFor({ state: 'detached' });
    await page.locator('#session-empty').waitFor();
    assert.equal(await byId('session-title').textContent(), 'No session selected');

    const res = await page.request.get(`${base}/api/sessions`);
    assert.equal(res.status(), 200);
    assert.deepEqual((await res.json()).sessions, []);
  });

  step('signs in to an agent that needs its own login, through its auth method', async () => {
    const marker = path.join(gw.tmp, 'homes', user, '.acp-demo-agent', 'login');
    assert.equal(existsSync(marker), false);
    await byId('agent-select').selectOption('login');
    await connected();
    await byId('new-session').click();

    const card = byId('agent-auth');
    await card.waitFor();
    assert.match(await card.textContent(), /Authentication required/);
    assert.match(await card.textContent(), /Signs this user's demo agent in \(stored in \$HOME\)/);
    const method = byId('auth-method');
    assert.equal(await method.count(), 1);
    assert.equal(await method.textContent(), 'Demo login');
    assert.equal(await byId('session-item').count(), 0, 'no session before the agent is signed in');
    await view.shot('agent-login');
    await method.click();

    // authenticate went to this user's own agent (its HOME), then session/new was retried.
    await card.waitFor({ state: 'detached' });
    await page.locator('.note', { hasText: 'Signed in to the agent with Demo login.' }).waitFor();
    await byId('session-item').first().waitFor();
    assert.ok(existsSync(marker), `no login marker in ${marker}`);
    await byId('prompt-input').fill(PROMPT_3);
    await byId('send').click();
    await agentReply(`chunk 5/5: you said: ${PROMPT_3}`).waitFor();
    const list = await (await page.request.get(`${base}/api/sessions`)).json();
    assert.equal(list.sessions?.[0]?._meta?.agent, 'login');
    assert.equal(list.sessions?.[0]?.cwd, workspaceRoot(user));
  });

  step('shows the sign-in panel without a login, and /acp refuses the socket', async () => {
    const stranger = await browser.browser.newContext();
    try {
      stranger.setDefaultTimeout(STEP_MS);
      const other = await stranger.newPage();
      const otherErrors = [];
      other.on('pageerror', (err) => otherErrors.push(String(err?.stack ?? err)));
      await other.goto(`${base}/`);
      await other.getByRole('heading', { name: 'Not signed in' }).waitFor();
      await other.getByTestId('signin-token').waitFor();
      assert.equal(await other.locator('#app').isVisible(), false);
      await other.screenshot({ path: path.join(SCREENSHOTS, 'signin.png') });

      const outcome = await other.evaluate(() => new Promise((resolve) => {
        const ws = new WebSocket(`ws://${location.host}/acp`, ['acp']);
        ws.onopen = () => { ws.close(); resolve('open'); };
        ws.onclose = (event) => resolve(`closed ${event.code}`);
      }));
      assert.equal(outcome, 'closed 1006', 'an unauthenticated WebSocket must not connect');
      assert.equal((await other.request.get(`${base}/api/sessions`)).status(), 401);
      assert.equal(await upgradeStatus(new URL(base).port), 401);

      // The printed link worked once; a second use is refused.
      const reused = await other.goto(loginUrl);
      assert.equal(reused.status(), 401);
      await other.getByText('expired or already used').waitFor();

      // The sign-in form posts the token (never in a URL); a bad one is refused on the page.
      await other.goto(`${base}/`);
      await other.getByTestId('signin-token').fill('not-a-token');
      await other.getByTestId('signin-submit').click();
      await other.getByTestId('signin-error').waitFor();
      assert.match(await other.getByTestId('signin-error').textContent(), /refused/);
      const posted = [];
      other.on('request', (req) => { if (req.url().includes('/auth/login')) posted.push(`${req.method()} ${req.url()}`); });
      await other.getByTestId('signin-token').fill(token);
      await other.getByTestId('signin-submit').click();
      await other.locator('[data-testid="conn-status"][data-state="connected"]').waitFor();
      assert.equal(await other.getByTestId('user-name').textContent(), 'alice');
      assert.equal(await other.getByTestId('cwd-input').inputValue(), workspaceRoot('alice'));
      assert.deepEqual(posted, [`POST ${base}/auth/login`], 'the token went in a POST body');
      assert.equal(new URL(other.url()).search, '');
      const cookies = await stranger.cookies(base);
      const cookie = cookies.find((c) => c.name === 'acp_gateway_token');
      assert.ok(cookie, `no cookie: ${JSON.stringify(cookies.map((c) => c.name))}`);
      assert.equal(cookie.httpOnly, true);
      assert.equal(cookie.sameSite, 'Strict');
      assert.deepEqual(otherErrors, [], 'uncaught errors in the signed-out page');
    } finally {
      await stranger.close();
    }
  }, { always: true });

  step('raised no page errors and no Content-Security-Policy violations', () => {
    assert.deepEqual(view.errors(), NO_ERRORS, 'page errors, console errors or Content-Security-Policy violations');
  }, { always: true });

  step('shuts down cleanly on SIGTERM and leaves no process behind', async () => {
    await browser.close();
    browser = null;
    const started = Date.now();
    const { status, leaked } = await stopGateway();
    assert.deepEqual(leaked, [], 'processes started by the gateway outlived it');
    assert.deepEqual(status, { code: 0, signal: null },
      `the gateway did not exit cleanly on SIGTERM\n--- gateway log ---\n${gw.log()}`);
    assert.ok(Date.now() - started < 15_000, 'shutdown took longer than the grace period');
  }, { always: true });
});
