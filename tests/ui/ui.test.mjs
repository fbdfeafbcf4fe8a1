// End-to-end test of the web UI (static/) in Debian's Chromium, driven by playwright-core,
// against the real gateway binary (target/debug/acp-gateway) with real demo-agent processes
// and a real SQLite file. Run: `cargo build && cd tests/ui && npm ci && node --test`.
// TEST_LOG=1 prints the gateway's log as it runs.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '../..');
const BINARY = path.join(REPO, 'target/debug/acp-gateway');
const SCREENSHOTS = path.join(HERE, 'screenshots');
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const VERBOSE = process.env.TEST_LOG === '1';

/** Budget for one UI step (an element appearing, a reply streaming in). */
const STEP_MS = 15_000;
const PROMPT_1 = 'hello from the browser';
const PROMPT_2 = 'please look around [permission]';
const PROMPT_3 = 'hello from a signed-in agent';

const execFileAsync = promisify(execFile);

/** A free TCP port on 127.0.0.1: bind port 0, read it, close. */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Polls `check` (async, truthy = done) until it passes or `ms` elapse. */
async function waitUntil(what, check, { ms = 30_000, every = 50 } = {}) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      if (await check()) return;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    await new Promise((resolve) => setTimeout(resolve, every));
  }
}

/**
 * Pids of live processes with an environment variable whose value mentions `dir`: our gateway
 * (ACP_GATEWAY_DATA_DIR) and its agents (a clean environment, but HOME is the user's home under
 * the data directory).
 */
function processesWithEnv(dir) {
  const pids = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${name}/environ`, 'latin1').split('\0').some((kv) => kv.includes(dir))) {
        const stat = readFileSync(`/proc/${name}/stat`, 'latin1');
        if (stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z') pids.push(Number(name));
      }
    } catch { /* gone, or not ours to read */ }
  }
  return pids;
}

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
  let tmp;
  let env;
  let envMarker;
  let gateway;
  let gatewayExit;
  let gatewayLog = '';
  let base;
  let token;
  let loginUrl; // the one-time link `serve` printed
  let user; // who that link signs in
  let browser;
  let context;
  let page;
  const pageErrors = [];
  const consoleErrors = [];
  const cspViolations = [];
  let sessionId;

  before(async () => {
    assert.ok(existsSync(BINARY), `${BINARY} is missing: run \`cargo build\` first`);
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: install Debian's chromium`);
    tmp = mkdtempSync(path.join(os.tmpdir(), 'acp-gateway-ui-'));
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    envMarker = tmp;
    env = {
      ...process.env,
      ACP_GATEWAY_LISTEN: `127.0.0.1:${port}`,
      ACP_GATEWAY_DATA_DIR: tmp,
      DATABASE_URL: `sqlite://${tmp}/ui.db`,
      ACP_GATEWAY_JWT_SECRET: 'ui-test-secret-0123456789-0123456789',
      ACP_GATEWAY_STATIC_DIR: path.join(REPO, 'static'),
      ACP_GATEWAY_AGENT: `${BINARY} demo-agent --delay-us 2000 --chunks 5`,
      RUST_LOG: process.env.RUST_LOG || 'info',
      NO_COLOR: '1',
    };
    delete env.ACP_GATEWAY_JWT_PUBLIC_KEY;
    delete env.ACP_GATEWAY_JWT_ISSUER;
    delete env.ACP_GATEWAY_JWT_AUDIENCE;
    // A second agent that needs its own login (like claude or codex): the web UI signs the user in
    // to it through its auth method.
    const configFile = path.join(tmp, 'gateway.toml');
    writeFileSync(configFile, [
      '[agents.login]',
      `command = ${JSON.stringify(BINARY)}`,
      'args = ["demo-agent", "--require-auth", "--delay-us", "2000", "--chunks", "5"]',
      '',
    ].join('\n'));

    let stdout = '';
    gateway = spawn(BINARY, ['serve', '--config', configFile], { env, cwd: tmp, stdio: ['ignore', 'pipe', 'pipe'] });
    gateway.stdout.on('data', (chunk) => { stdout += chunk.toString(); });
    gatewayExit = new Promise((resolve) => gateway.once('exit', (code, signal) => resolve({ code, signal })));
    const keep = (chunk) => {
      const text = chunk.toString();
      if (VERBOSE) process.stderr.write(text);
      gatewayLog = (gatewayLog + text).slice(-64 * 1024);
    };
    gateway.stdout.on('data', keep);
    gateway.stderr.on('data', keep);
    let exited = null;
    gatewayExit.then((status) => { exited = status; });

    await waitUntil('GET /readyz to answer 200', async () => {
      if (exited) throw new Error(`gateway exited early (${JSON.stringify(exited)}):\n${gatewayLog}`);
      const res = await fetch(`${base}/readyz`, { signal: AbortSignal.timeout(2_000) });
      return res.status === 200;
    }).catch((err) => {
      if (exited) throw err;
      throw new Error(`${err.message}\n--- gateway log ---\n${gatewayLog}`);
    });

    // `serve` prints a one-time login link for user `local`, never a token.
    await waitUntil('the login link on stdout', () => /\/auth\/login\?code=\S+/.test(stdout), { ms: STEP_MS });
    loginUrl = stdout.match(/http:\/\/\S+\/auth\/login\?code=\S+/)?.[0];
    assert.ok(loginUrl?.startsWith(`${base}/auth/login?code=`), `unexpected login link in:\n${stdout}`);
    assert.doesNotMatch(stdout, /token=/, 'serve printed a token');
    user = 'local';

    const minted = await execFileAsync(BINARY, ['token', '--sub', 'alice'], { env, cwd: tmp, timeout: 30_000 });
    token = minted.stdout.trim().split(/\s+/).pop();
    assert.match(token, /^[\w-]+\.[\w-]+\.[\w-]+$/, `token command printed no JWT: ${minted.stdout}`);

    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'],
      timeout: 60_000,
    });
    context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    context.setDefaultTimeout(STEP_MS);
    // Content-Security-Policy violations, reported from inside every document the page loads.
    await context.exposeFunction('reportCspViolation', (v) => cspViolations.push(v));
    await context.addInitScript(() => {
      document.addEventListener('securitypolicyviolation', (e) => {
        window.reportCspViolation(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} in ${e.sourceFile}:${e.lineNumber}`);
      });
    });
    page = await context.newPage();
    page.on('pageerror', (err) => pageErrors.push(String(err?.stack ?? err)));
    page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(`${msg.text()} (${msg.location()?.url ?? ''})`); });
    page.on('dialog', (dialog) => dialog.accept());
    mkdirSync(SCREENSHOTS, { recursive: true });
  });

  /** SIGTERM, wait for the exit (SIGKILL after 20 s); then every process it started must be gone. */
  async function stopGateway() {
    if (!gateway) return { status: null, leaked: [] };
    if (gateway.exitCode === null && gateway.signalCode === null) {
      gateway.kill('SIGTERM');
      const graceful = await Promise.race([
        gatewayExit.then(() => true),
        new Promise((resolve) => setTimeout(() => resolve(false), 20_000).unref()),
      ]);
      if (!graceful) gateway.kill('SIGKILL');
    }
    const status = await gatewayExit;
    let leaked = [];
    try {
      await waitUntil('the agent processes to exit', () => processesWithEnv(envMarker).length === 0, { ms: 10_000 });
    } catch {
      leaked = processesWithEnv(envMarker);
      leaked.forEach((pid) => { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } });
    }
    return { status, leaked };
  }

  after(async () => {
    // A safety net for failed runs; the last test does this and checks the outcome.
    await browser?.close().catch(() => {});
    await stopGateway();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  // The steps below form one scenario: after a failure the rest are skipped (they would only time
  // out), the page is saved as screenshots/failure.png, and the gateway's log is printed.
  let broken = null;
  const step = (name, fn, { always = false } = {}) => it(name, async (t) => {
    if (broken && !always) return t.skip(`an earlier step failed: ${broken}`);
    try {
      await fn(t);
    } catch (err) {
      if (!broken) {
        broken = name;
        await page?.screenshot({ path: path.join(SCREENSHOTS, 'failure.png') }).catch(() => {});
        process.stderr.write(`--- gateway log (last 64 KiB) ---\n${gatewayLog}\n`);
      }
      throw err;
    }
  });

  const byId = (testid) => page.getByTestId(testid);
  const connected = () => page.locator('[data-testid="conn-status"][data-state="connected"]').waitFor();
  const agentReply = (text) => byId('message-agent').filter({ hasText: text }).first();
  const userMessage = (text) => byId('message-user').filter({ hasText: text });

  /** The user's first workspace root, as the gateway reports it. */
  const workspaceRoot = (name) => path.join(tmp, 'workspaces', name);

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

    await page.screenshot({ path: path.join(SCREENSHOTS, 'conversation.png') });

    // The leak check in `after` finds the gateway's processes by their environment: make sure
    // that it can see the agent process serving this session.
    const agents = processesWithEnv(envMarker).filter((pid) => pid !== gateway.pid);
    assert.ok(agents.length >= 1, 'no agent process found by environment: the leak check would be blind');
  });

  step('asks for permission and continues once allowed', async () => {
    await byId('prompt-input').fill(PROMPT_2);
    await byId('prompt-input').press('Enter');
    await userMessage(PROMPT_2).waitFor();

    const allow = byId('permission-option').and(page.locator('[class*="kind-allow"]')).first();
    await allow.waitFor();
    assert.match(await byId('permission').first().textContent(), /Read the workspace/);
    await page.screenshot({ path: path.join(SCREENSHOTS, 'permission.png') });
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
    await page.screenshot({ path: path.join(SCREENSHOTS, 'replayed.png') });
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
    const marker = path.join(tmp, 'homes', user, '.acp-demo-agent', 'login');
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
    await page.screenshot({ path: path.join(SCREENSHOTS, 'agent-login.png') });
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
    const stranger = await browser.newContext();
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
    assert.deepEqual(pageErrors, [], 'uncaught errors in the page');
    assert.deepEqual(consoleErrors, [], 'console errors in the page');
    assert.deepEqual(cspViolations, [], 'Content-Security-Policy violations');
  }, { always: true });

  step('shuts down cleanly on SIGTERM and leaves no process behind', async () => {
    await browser.close();
    const started = Date.now();
    const { status, leaked } = await stopGateway();
    assert.deepEqual(leaked, [], 'processes started by the gateway outlived it');
    assert.deepEqual(status, { code: 0, signal: null },
      `the gateway did not exit cleanly on SIGTERM\n--- gateway log ---\n${gatewayLog}`);
    assert.ok(Date.now() - started < 15_000, 'shutdown took longer than the grace period');
  }, { always: true });
});
