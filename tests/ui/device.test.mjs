// Device sign-in in Chromium (contract, "Device sign-in"): a program asks for a code, the person
// signed in opens /device?code=… on a phone, sees which device asks and approves; the program's
// poll gets a token; the device is listed in the "?" dialog with its last use and revoked there,
// and its token is refused at once. Screenshots: screenshots/device-approve-phone.png,
// device-approved-phone.png, devices-listed.png.
//
// Run: `cargo build && cd tests/ui && node --test device.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { DESKTOP, PHONE, connected, openBrowser, scenario, startGateway, waitUntil } from './harness.mjs';

const GRANT = 'urn:ietf:params:oauth:grant-type:device_code';

describe('device sign-in: approved in the browser, listed and revoked', { timeout: 180_000 }, () => {
  let gw, browser, phone, desk, started, token;

  before(async () => {
    gw = await startGateway();
    browser = await openBrowser();
  });
  after(async () => {
    await browser?.close().catch(() => {});
    await gw?.dispose();
  });

  const step = scenario(async () => {
    await phone?.shot('failure-device-phone');
    process.stdout.write(gw.log());
  });

  const poll = async () => {
    const res = await fetch(`${gw.base}/auth/device/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ grant_type: GRANT, device_code: started.device_code }),
    });
    return { status: res.status, body: await res.json() };
  };

  step('the person sees which device asks, on a phone, and approves it', async () => {
    const res = await fetch(`${gw.base}/auth/device`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ client_id: 'acp-gateway', client_name: 'acp-gateway on build-box (alice)' }),
    });
    assert.equal(res.status, 200);
    started = await res.json();
    phone = await browser.open(gw, { ...PHONE, goto: false });
    await phone.page.goto(started.verification_uri_complete);
    await phone.page.getByTestId('device-name').filter({ hasText: 'build-box' }).waitFor();
    assert.equal(await phone.page.getByTestId('device-code').inputValue(), started.user_code);
    await phone.shot('device-approve-phone');
    await phone.page.getByTestId('device-approve').click();
    await phone.page.locator('[data-testid="device-status"][data-state="approved"]').waitFor();
    await phone.shot('device-approved-phone');
  });

  step('the program gets its token on its next poll, once', async () => {
    let last;
    await waitUntil('the device poll to give a token', async () => {
      last = await poll();
      return last.status === 200;
    }, { ms: 15_000, every: 1_000 });
    token = last.body.access_token;
    assert.ok(token);
    assert.equal((await poll()).body.error, 'expired_token');
  });

  step('a code already decided cannot be decided again in the page', async () => {
    await phone.page.goto(started.verification_uri_complete);
    await phone.page.locator('[data-testid="device-status"][data-state="issued"]').waitFor();
    assert.equal(await phone.page.getByTestId('device-ask').isHidden(), true);
  });

  step('the device is listed with its last use, and revoking it refuses its token at once', async () => {
    const res = await fetch(`${gw.base}/api/me`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, 200);
    desk = await browser.open(gw, DESKTOP);
    await connected(desk.page);
    await desk.page.getByTestId('shortcuts-button').click();
    const row = desk.page.getByTestId('signed-in-device').filter({ hasText: 'build-box' });
    await row.waitFor();
    assert.doesNotMatch(await row.textContent(), /last used never/);
    await desk.shot('devices-listed', desk.page.getByTestId('shortcuts-dialog'));
    await row.getByRole('button', { name: /Sign .* out/ }).click();
    await row.waitFor({ state: 'detached' });
    const refused = await fetch(`${gw.base}/api/me`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(refused.status, 401);
  });
});
