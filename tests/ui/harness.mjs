// What every browser test of the web UI shares: a real gateway process (target/debug/acp-gateway,
// real agent processes, a real SQLite file in a temporary directory), Debian's Chromium driven by
// playwright-core, and the checks every page must pass (no page error, no console error, no
// Content-Security-Policy violation). TEST_LOG=1 prints the gateway's log as it runs.
//
//   const gw = await startGateway({ agent: ['demo-agent', '--showcase'] });
//   const b = await openBrowser();
//   const v = await b.open(gw, { width: 390, height: 844 });   // signed in as `local`
//   ... v.page ...; await v.shot('name'); assert.deepEqual(v.errors(), NO_ERRORS);
//   await b.close(); await gw.stop();

import assert from 'node:assert/strict';
import { it } from 'node:test';
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, '../..');
export const BINARY = path.join(REPO, 'target/debug/acp-gateway');
export const SCREENSHOTS = path.join(HERE, 'screenshots');
export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const VERBOSE = process.env.TEST_LOG === '1';

/** Budget for one UI step (an element appearing, a reply streaming in). */
export const STEP_MS = 15_000;

/** What `errors()` returns on a clean page. */
export const NO_ERRORS = { page: [], console: [], csp: [] };

export const DESKTOP = { width: 1280, height: 800 };
export const PHONE = { width: 390, height: 844, isMobile: true, hasTouch: true };

const execFileAsync = promisify(execFile);

/** A free TCP port on 127.0.0.1: bind port 0, read it, close. */
export function freePort() {
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
export async function waitUntil(what, check, { ms = 30_000, every = 50 } = {}) {
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
export function processesWithEnv(dir) {
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

/**
 * Starts `acp-gateway serve` on a free port with its data in a fresh temporary directory.
 *   agent:  argv of the default agent after this binary (e.g. ['demo-agent', '--showcase']), or
 *           a full command line string (ACP_GATEWAY_AGENT); omitted: the built-in default agent.
 *   config: extra TOML for `--config` (named agents, limits…).
 *   env:    extra environment; `bare: true` starts it as a new user would (no secret, no
 *           database URL: the defaults under the working directory).
 */
export async function startGateway({ agent, config, env: extra = {}, bare = false, port: chosenPort } = {}) {
  assert.ok(existsSync(BINARY), `${BINARY} is missing: run \`cargo build\` first`);
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'acp-gateway-ui-'));
  const port = chosenPort ?? await freePort();
  const base = `http://127.0.0.1:${port}`;
  const env = { ...process.env, ACP_GATEWAY_LISTEN: `127.0.0.1:${port}`, RUST_LOG: process.env.RUST_LOG || 'info', NO_COLOR: '1' };
  for (const name of ['ACP_GATEWAY_JWT_PUBLIC_KEY', 'ACP_GATEWAY_JWT_ISSUER', 'ACP_GATEWAY_JWT_AUDIENCE',
    'ACP_GATEWAY_AGENT', 'ACP_GATEWAY_JWT_SECRET', 'DATABASE_URL', 'ACP_GATEWAY_DATA_DIR']) delete env[name];
  if (!bare) {
    Object.assign(env, {
      ACP_GATEWAY_DATA_DIR: tmp,
      DATABASE_URL: `sqlite://${tmp}/ui.db`,
      ACP_GATEWAY_JWT_SECRET: 'ui-test-secret-0123456789-0123456789',
      ACP_GATEWAY_STATIC_DIR: path.join(REPO, 'static'),
    });
  }
  if (Array.isArray(agent)) env.ACP_GATEWAY_AGENT = [BINARY, ...agent].join(' ');
  else if (typeof agent === 'string') env.ACP_GATEWAY_AGENT = agent;
  Object.assign(env, extra);
  const args = ['serve'];
  if (config) {
    const file = path.join(tmp, 'gateway.toml');
    writeFileSync(file, config);
    args.push('--config', file);
  }

  let stdout = '';
  let log = '';
  const child = spawn(BINARY, args, { env, cwd: tmp, stdio: ['ignore', 'pipe', 'pipe'] });
  const exit = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  let exited = null;
  exit.then((status) => { exited = status; });
  child.stdout.on('data', (chunk) => { stdout += chunk.toString(); });
  const keep = (chunk) => {
    const text = chunk.toString();
    if (VERBOSE) process.stderr.write(text);
    log = (log + text).slice(-64 * 1024);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);

  const gw = {
    base, port, tmp, env, child, exit,
    /** The gateway's last 64 KiB of output. */
    log: () => log,
    stdout: () => stdout,
    /** A JWT for `sub`, from `acp-gateway token` with the gateway's environment. */
    async token(sub) {
      const minted = await execFileAsync(BINARY, ['token', '--sub', sub], { env, cwd: tmp, timeout: 30_000 });
      const jwt = minted.stdout.trim().split(/\s+/).pop();
      assert.match(jwt, /^[\w-]+\.[\w-]+\.[\w-]+$/, `token command printed no JWT: ${minted.stdout}`);
      return jwt;
    },
    /** A user's first workspace root, as the gateway reports it (the default layout). */
    workspaceRoot: (user) => path.join(bare ? path.join(tmp, 'data') : tmp, 'workspaces', user),
    /** SIGTERM, wait for the exit (SIGKILL after 20 s); then every process it started must be gone. */
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const graceful = await Promise.race([
          exit.then(() => true),
          new Promise((resolve) => setTimeout(() => resolve(false), 20_000).unref()),
        ]);
        if (!graceful) child.kill('SIGKILL');
      }
      const status = await exit;
      let leaked = [];
      const marker = bare ? path.join(tmp, 'data') : tmp;
      try {
        await waitUntil('the agent processes to exit', () => processesWithEnv(marker).length === 0, { ms: 10_000 });
      } catch {
        leaked = processesWithEnv(marker);
        leaked.forEach((pid) => { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } });
      }
      return { status, leaked };
    },
    /** stop(), then remove the temporary directory. */
    async dispose() {
      const outcome = await gw.stop();
      rmSync(tmp, { recursive: true, force: true });
      return outcome;
    },
  };

  try {
    await waitUntil('GET /readyz to answer 200', async () => {
      if (exited) throw new Error(`gateway exited early (${JSON.stringify(exited)})`);
      const res = await fetch(`${base}/readyz`, { signal: AbortSignal.timeout(2_000) });
      return res.status === 200;
    });
    // `serve` prints a one-time login link for user `local`.
    await waitUntil('the login link on stdout', () => /\/auth\/login\?code=\S+/.test(stdout), { ms: STEP_MS });
  } catch (err) {
    await gw.stop();
    throw new Error(`${err.message}\n--- gateway log ---\n${log}`);
  }
  gw.loginUrl = stdout.match(/http:\/\/\S+\/auth\/login\?code=\S+/)?.[0];
  return gw;
}

/** Launches Debian's Chromium headless with the flags this machine needs. */
export async function openBrowser() {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: install Debian's chromium`);
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    timeout: 60_000,
  });
  mkdirSync(SCREENSHOTS, { recursive: true });
  return {
    browser,
    /**
     * A new browser context and page on `gw`, signed in as `user` (default `local`) through the
     * sign-in form's POST (a cookie), at the given viewport (DESKTOP, PHONE or any
     * playwright context options). `signedIn: false` leaves it signed out. The page is at `/`.
     */
    async open(gw, { user = 'local', signedIn = true, goto = true, ...options } = {}) {
      const context = await browser.newContext({ viewport: DESKTOP, ...viewportOf(options) });
      context.setDefaultTimeout(STEP_MS);
      const errors = { page: [], console: [], csp: [] };
      // Content-Security-Policy violations, reported from inside every document the page loads.
      await context.exposeFunction('reportCspViolation', (v) => errors.csp.push(v));
      await context.addInitScript(() => {
        document.addEventListener('securitypolicyviolation', (e) => {
          window.reportCspViolation(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} in ${e.sourceFile}:${e.lineNumber}`);
        });
      });
      if (signedIn) {
        const res = await context.request.post(`${gw.base}/auth/login`, {
          form: { token: await gw.token(user) }, maxRedirects: 0,
        });
        assert.ok([200, 303].includes(res.status()), `sign-in answered ${res.status()}`);
      }
      const page = await context.newPage();
      watch(page, errors);
      if (goto) await page.goto(`${gw.base}/`);
      return {
        page, context, user,
        /** Errors seen by every page of this context so far. */
        errors: () => ({ page: [...errors.page], console: [...errors.console], csp: [...errors.csp] }),
        /** Another page (tab) in the same context, watched the same way. */
        async newPage() {
          const other = await context.newPage();
          watch(other, errors);
          if (goto) await other.goto(`${gw.base}/`);
          return other;
        },
        /** Saves screenshots/NAME.png of `target` (default: this page). */
        shot: (name, target = page) => target.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`) }),
        close: () => context.close(),
      };
    },
    close: () => browser.close(),
  };
}

/** Playwright context options from a viewport spec: {width, height, ...rest}. */
function viewportOf({ width, height, ...rest }) {
  return width && height ? { viewport: { width, height }, ...rest } : rest;
}

function watch(page, errors) {
  page.on('pageerror', (err) => errors.page.push(String(err?.stack ?? err)));
  page.on('console', (msg) => {
    if (msg.type() === 'error') errors.console.push(`${msg.text()} (${msg.location()?.url ?? ''})`);
  });
}

/** Waits until the page's ACP socket is connected. */
export const connected = (page) => page.locator('[data-testid="conn-status"][data-state="connected"]').waitFor();

/** Closes the browser, stops the gateway and removes its files; no process it started may be left. */
export async function shutdown(browser, gw) {
  await browser?.close().catch(() => {});
  const outcome = await gw?.dispose();
  assert.deepEqual(outcome?.leaked ?? [], [], 'processes started by the gateway outlived it');
}

/**
 * `it` for the steps of one scenario: after a failure the rest are skipped (they would only time
 * out), and the first failure calls `onFailure` (a screenshot, the gateway's log). A step with
 * `{ always: true }` runs regardless.
 */
export function scenario(onFailure) {
  let broken = null;
  return (name, fn, { always = false } = {}) => it(name, async (t) => {
    if (broken && !always) return t.skip(`an earlier step failed: ${broken}`);
    try {
      await fn(t);
    } catch (err) {
      if (!broken) {
        broken = name;
        await onFailure().catch(() => {});
      }
      throw err;
    }
  });
}

/** axe-core's source, for `axeScan`. */
let axeSource = null;

/**
 * Runs axe-core on the page as it is (through CDP: the page keeps its real CSP); returns its
 * violations, trimmed to what a report needs.
 */
export async function axeScan(page) {
  axeSource ??= readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
  await page.evaluate(axeSource);
  return page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const result = await axe.run(document, { resultTypes: ['violations'] });
    return result.violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.map((n) => ({ target: n.target.join(' '), summary: n.failureSummary?.split('\n').slice(1, 3).join(' ') })),
    }));
  });
}
