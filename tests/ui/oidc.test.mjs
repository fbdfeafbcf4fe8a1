// Team sign-in in Chromium: a real OpenID provider (tests/oidc/provider.mjs, oidc-provider from
// npm) on loopback and the real gateway configured for it (`ACP_GATEWAY_OIDC_*`, members of
// `devs` only, checked again every second). People sign in through the provider's own pages,
// use the UI, do not see each other's sessions, sign out through the provider; someone outside
// the group is refused by name; someone removed from the group mid-session loses the socket and
// is back at the sign-in page.
//
// Run: `cargo build && (cd tests/oidc && npm ci) && cd tests/ui && node --test oidc.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import path from 'node:path';
import { NO_ERRORS, REPO, connected, freePort, openBrowser, scenario, startGateway } from './harness.mjs';

const CLIENT = { client_id: 'acp-gateway-ui', client_secret: 'ui-test-client-secret-0123456789' };

/** Starts the test provider with the gateway at `base` as its client; {issuer, control, stop}. */
async function startProvider(base) {
  const child = spawn(process.execPath, ['provider.mjs'], {
    cwd: path.join(REPO, 'tests/oidc'),
    env: {
      ...process.env,
      OIDC_CLIENTS: JSON.stringify([{ ...CLIENT, redirect_uris: [`${base}/auth/oidc/callback`], post_logout_redirect_uris: [`${base}/`] }]),
    },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const line = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    lines.once('line', resolve);
    child.once('exit', (code) => reject(new Error(`the provider exited (${code})`)));
  });
  const { issuer } = JSON.parse(line);
  return {
    issuer,
    control: async (route, body) => (await fetch(`${issuer}/__test/${route}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    })).json(),
    stop: () => child.kill('SIGTERM'),
  };
}

describe('team sign-in through an OpenID provider', { timeout: 180_000 }, () => {
  let provider;
  let gw;
  let browser;
  const views = [];

  before(async () => {
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    provider = await startProvider(base);
    gw = await startGateway({
      port,
      env: {
        ACP_GATEWAY_OIDC_ISSUER: provider.issuer,
        ACP_GATEWAY_OIDC_CLIENT_ID: CLIENT.client_id,
        ACP_GATEWAY_OIDC_CLIENT_SECRET: CLIENT.client_secret,
        ACP_GATEWAY_OIDC_REDIRECT_URL: `${base}/auth/oidc/callback`,
        ACP_GATEWAY_OIDC_LABEL: 'Test IdP',
        ACP_GATEWAY_OIDC_SCOPES: 'openid,profile,email,groups',
        ACP_GATEWAY_OIDC_ALLOWED_GROUPS: 'devs',
        ACP_GATEWAY_OIDC_RECHECK_SECS: '1',
      },
    });
    browser = await openBrowser();
  });

  after(async () => {
    await browser?.close().catch(() => {});
    await gw?.dispose();
    provider?.stop();
  });

  const step = scenario(async () => {
    for (const [i, v] of views.entries()) await v.shot(`failure-oidc-${i}`).catch(() => {});
    process.stdout.write(gw.log());
  });

  /** A fresh browser that signs `login` in through the provider's pages; its view. */
  async function signIn(login) {
    const view = await browser.open(gw, { signedIn: false });
    views.push(view);
    const { page } = view;
    const button = page.locator('[data-testid="signin-oidc"]');
    await button.waitFor();
    assert.equal((await button.textContent()).trim(), 'Sign in with Test IdP');
    if (views.length === 1) await view.shot('oidc-signin-page');
    await button.click();
    await page.waitForURL((url) => url.href.startsWith(provider.issuer));
    await page.locator('input[name="login"]').fill(login);
    await page.locator('input[name="password"]').fill('correct horse');
    await page.locator('#sign-in').click();
    return view;
  }

  let alice;
  step('a member signs in through the provider\'s own pages and uses the UI', async () => {
    alice = await signIn('alice');
    const { page } = alice;
    await connected(page);
    await page.locator('.user-name, [data-testid="user-name"]', { hasText: 'alice' }).first().waitFor();
    await page.locator('[data-testid="new-session"]').click();
    await page.locator('[data-testid="prompt-input"]').fill('hello from alice');
    await page.locator('[data-testid="send"]').click();
    await page.locator('[data-testid="message-agent"]').first().waitFor();
    await page.locator('[data-testid="session-item"]').first().waitFor();
    await alice.shot('oidc-signed-in');
  });

  let bob;
  step('a second member sees none of the first one\'s sessions', async () => {
    bob = await signIn('bob');
    await connected(bob.page);
    const sessions = await (await bob.page.request.get(`${gw.base}/api/sessions`)).json();
    assert.equal(sessions.sessions.length, 0, JSON.stringify(sessions));
    assert.equal(await bob.page.locator('[data-testid="session-item"]').count(), 0);
  });

  step('someone outside the allowed group is refused, by name', async () => {
    const carol = await signIn('carol');
    await carol.page.locator('[data-testid="oidc-title"]', { hasText: 'Not allowed' }).waitFor();
    assert.match(await carol.page.locator('[data-testid="oidc-message"]').textContent(), /You signed in as carol/);
    const me = await carol.page.request.get(`${gw.base}/api/me`);
    assert.equal(me.status(), 401);
  });

  step('sign-out ends the sign-in at the gateway and at the provider', async () => {
    const { page } = alice;
    await page.locator('#logout').click();
    // The provider's sign-out page sends the browser back to the gateway's sign-in page.
    await page.locator('[data-testid="signin-oidc"]').waitFor();
    assert.ok(page.url().startsWith(gw.base), page.url());
    assert.equal((await page.request.get(`${gw.base}/api/me`)).status(), 401);
  });

  step('removed from the group mid-session: the socket closes and the sign-in page is back', async () => {
    await bob.page.locator('[data-testid="conn-status"][data-state="connected"]').waitFor();
    await provider.control('groups', { user: 'bob', groups: ['sales'] });
    await bob.page.locator('[data-testid="signin-oidc"]').waitFor({ timeout: 30_000 });
    assert.equal((await bob.page.request.get(`${gw.base}/api/me`)).status(), 401);
  });

  step('raised no page errors, console errors or CSP violations', () => {
    for (const v of views) {
      const errors = v.errors();
      // The refused sign-in's 403 and the ended sign-in's 401s (a page fetch, the socket's
      // reconnect) are answers, not page faults; the test provider's own pages have no favicon.
      errors.console = errors.console.filter((e) => !/status of (401|403)|HTTP Authentication failed/.test(e)
        && !e.includes(`${provider.issuer}/favicon.ico`));
      assert.deepEqual(errors, NO_ERRORS, `gateway ${gw.base}, provider ${provider.issuer}`);
    }
  });
});
