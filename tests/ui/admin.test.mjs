// The Administration dialog in Chromium: an admin (`ACP_GATEWAY_ADMIN_USERS=root`) sees the users,
// stops another user's running prompt from the live sessions (that user's page says who stopped
// it), and finds both in the audit log; a non-admin has no Administration button.
//
// Run: `cargo build && cd tests/ui && node --test admin.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { NO_ERRORS, axeScan, connected, openBrowser, scenario, startGateway } from './harness.mjs';

describe('administration in the browser', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let bob;
  let root;

  before(async () => {
    gw = await startGateway({ env: { ACP_GATEWAY_ADMIN_USERS: 'root' } });
    browser = await openBrowser();
    bob = await browser.open(gw, { user: 'bob' });
    root = await browser.open(gw, { user: 'root' });
    await connected(bob.page);
    await connected(root.page);
  });

  after(async () => {
    await browser?.close().catch(() => {});
    await gw?.dispose();
  });

  const step = scenario(async () => {
    await root.shot('failure-admin');
    await bob.shot('failure-admin-bob');
    process.stdout.write(gw.log());
  });

  step('a non-admin has no Administration button; an admin does', async () => {
    assert.equal(await bob.page.locator('[data-testid="admin-open"]').isHidden(), true);
    await root.page.locator('[data-testid="admin-open"]').waitFor();
  });

  step('the admin stops another user\'s running prompt, and that user is told', async () => {
    await bob.page.locator('[data-testid="new-session"]').click();
    await bob.page.locator('[data-testid="prompt-input"]').fill('a long job [hang]');
    await bob.page.locator('[data-testid="send"]').click();
    await bob.page.locator('[data-testid="plan"]').waitFor();

    const { page } = root;
    await page.locator('[data-testid="admin-open"]').click();
    const dialog = page.locator('[data-testid="admin-dialog"]');
    await dialog.locator('[data-testid="admin-users"]').getByRole('cell', { name: 'bob', exact: true }).waitFor();
    await dialog.locator('[data-testid="admin-tab-live-sessions"]').click();
    const row = dialog.locator('[data-testid="admin-sessions"] tr', { hasText: 'prompting' });
    await row.getByRole('cell', { name: 'bob', exact: true }).waitFor();
    assert.doesNotMatch(await dialog.textContent(), /a long job/, 'no transcript on the admin page');
    await root.shot('admin-live-sessions');
    await row.locator('[data-testid="admin-stop"]').click();
    await bob.page.locator('.note', { hasText: 'stopped by the administrator root' }).waitFor();
  });

  step('the audit log has the sign-ins, the session and the stop', async () => {
    const dialog = root.page.locator('[data-testid="admin-dialog"]');
    await dialog.locator('[data-testid="admin-tab-audit-log"]').click();
    const entries = dialog.locator('[data-testid="audit-entry"]');
    await entries.filter({ hasText: 'admin_stop' }).first().waitFor();
    await dialog.locator('[data-testid="audit-actor"]').fill('bob');
    await dialog.getByRole('button', { name: 'Filter' }).click();
    await entries.filter({ hasText: 'session_create' }).first().waitFor();
    const texts = await entries.allTextContents();
    assert.ok(texts.every((t) => t.includes('bob')), texts.join('\n'));
    assert.ok(texts.some((t) => t.includes('sign_in')), 'bob\'s sign-in is there');
    await root.shot('admin-audit');
  });

  step('axe finds nothing serious in the dialog, on each tab', async () => {
    const dialog = root.page.locator('[data-testid="admin-dialog"]');
    for (const tab of ['users', 'live-sessions', 'spending', 'audit-log']) {
      await dialog.locator(`[data-testid="admin-tab-${tab}"]`).click();
      await dialog.locator('.admin-content table').first().waitFor();
      const blocking = (await axeScan(root.page)).filter((v) => v.impact === 'serious' || v.impact === 'critical');
      assert.deepEqual(blocking, [], `${tab}: ${JSON.stringify(blocking, null, 1)}`);
    }
  });

  step('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(root.errors(), NO_ERRORS);
    assert.deepEqual(bob.errors(), NO_ERRORS);
  });
});
