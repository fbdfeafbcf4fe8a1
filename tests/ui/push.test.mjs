// Web Push (issue 20, item 1), phone-sized: the user opts this device in from the help dialog (a
// real service worker, static/sw.js, registered with the gateway's VAPID key), and a permission
// request in a session no visible tab shows is pushed. A push service in this test stands in for
// the browser vendor's (headless Chromium has none to subscribe at: `PushManager.subscribe` is
// given this test's endpoint and device keys, everything else is real). The push decrypts with
// the device's keys (RFC 8291, decrypted here with node:crypto) and holds no transcript text;
// delivered to the service worker (Chrome's DevTools protocol, as the vendor's service would), it
// shows a notification whose link opens the session at the permission request. Screenshot
// push-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test push.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import http from 'node:http';
import { connected, NO_ERRORS, openBrowser, PHONE, scenario, shutdown, startGateway, waitUntil } from './harness.mjs';

/** RFC 8291 / RFC 8188 (`aes128gcm`, one record): the push's plaintext, for this device's keys. */
function decrypt(body, ecdh, auth) {
  const salt = body.subarray(0, 16);
  const idlen = body[20];
  const serverKey = body.subarray(21, 21 + idlen);
  const record = body.subarray(21 + idlen);
  const shared = ecdh.computeSecret(serverKey);
  const info = Buffer.concat([Buffer.from('WebPush: info\0'), ecdh.getPublicKey(), serverKey]);
  const ikm = Buffer.from(crypto.hkdfSync('sha256', shared, auth, info, 32));
  const cek = Buffer.from(crypto.hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: aes128gcm\0'), 16));
  const nonce = Buffer.from(crypto.hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: nonce\0'), 12));
  const decipher = crypto.createDecipheriv('aes-128-gcm', cek, nonce);
  decipher.setAuthTag(record.subarray(record.length - 16));
  const padded = Buffer.concat([decipher.update(record.subarray(0, record.length - 16)), decipher.final()]);
  let end = padded.length - 1;
  while (end >= 0 && padded[end] === 0) end -= 1;
  assert.equal(padded[end], 2, 'the last record ends with the delimiter 0x02');
  return padded.subarray(0, end).toString('utf8');
}

describe('Web Push to an opted-in phone', { timeout: 240_000 }, () => {
  let gw;
  let browser;
  let service;
  const received = [];
  let v;
  let page;
  let sessionId;
  let payload;
  const ecdh = crypto.createECDH('prime256v1');
  ecdh.generateKeys();
  const auth = crypto.randomBytes(16);
  const step = scenario(async () => {
    await v?.shot('push-failure').catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    service = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        received.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks) });
        res.writeHead(201).end();
      });
    });
    await new Promise((resolve) => service.listen(0, '127.0.0.1', resolve));
    gw = await startGateway({
      agent: ['demo-agent', '--delay-us', '0', '--chunks', '2'],
      config: '[push]\nallow_http_endpoints = true\nendpoint_hosts = ["127.0.0.1"]\n',
    });
    browser = await openBrowser();
  });

  after(async () => {
    await shutdown(browser, gw);
    service?.close();
  });

  step('the phone opts in from the help dialog', async () => {
    v = await browser.open(gw, { ...PHONE, goto: false });
    page = v.page;
    await v.context.grantPermissions(['notifications'], { origin: gw.base });
    const subscription = {
      endpoint: `http://127.0.0.1:${service.address().port}/push/phone`,
      expirationTime: null,
      keys: { p256dh: ecdh.getPublicKey().toString('base64url'), auth: auth.toString('base64url') },
    };
    // The vendor's push service, stood in for: the subscription the browser would have made.
    await v.context.addInitScript((sub) => {
      PushManager.prototype.subscribe = async function subscribe(options) {
        window.__applicationServerKey = options?.applicationServerKey?.byteLength ?? 0;
        return { toJSON: () => sub };
      };
    }, subscription);
    await page.goto(`${gw.base}/`);
    await connected(page);
    await page.getByTestId('shortcuts-button').click();
    await page.getByTestId('push-enable').click();
    await page.getByTestId('push-device').waitFor();
    assert.match(await page.getByTestId('push-device').innerText(), /Chrome on Linux \(127\.0\.0\.1\)/);
    assert.equal(await page.evaluate(() => window.__applicationServerKey), 65, 'subscribed with the VAPID key');
    assert.ok(await page.evaluate(async () => !!(await navigator.serviceWorker.getRegistration('/'))?.active), 'the service worker runs');
    await v.shot('push-phone');
    await page.getByTestId('shortcuts-close').click();
  });

  step('a permission request in a session no visible tab shows is pushed, without transcript text', async () => {
    // The tab goes to the background (as a phone's screen turning off does).
    await page.evaluate(() => {
      Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await page.getByTestId('prompt-input').fill('deploy the release [permission]');
    await page.getByTestId('prompt-input').press('Enter');
    await waitUntil('a push', () => received.length > 0);
    const push = received[0];
    assert.equal(push.path, '/push/phone');
    assert.equal(push.headers['content-encoding'], 'aes128gcm');
    assert.match(push.headers.authorization, /^vapid t=[\w-]+\.[\w-]+\.[\w-]+, k=[\w-]{87}$/);
    payload = JSON.parse(decrypt(push.body, ecdh, auth));
    assert.equal(payload.kind, 'permission');
    assert.equal(payload.asked, 'Read the workspace');
    sessionId = payload.sessionId;
    assert.match(sessionId, /^[0-9a-f]{32}$/);
    assert.ok(!JSON.stringify(payload).includes('you said'), `no transcript text: ${JSON.stringify(payload)}`);
  });

  step('delivered to the service worker it shows a notification that opens the request', async () => {
    const cdp = await v.context.newCDPSession(page);
    const registrations = [];
    cdp.on('ServiceWorker.workerRegistrationUpdated', (e) => registrations.push(...e.registrations));
    await cdp.send('ServiceWorker.enable');
    await waitUntil('the registration', () => registrations.some((r) => r.scopeURL === `${gw.base}/`));
    const { registrationId } = registrations.find((r) => r.scopeURL === `${gw.base}/`);
    await cdp.send('ServiceWorker.deliverPushMessage', { origin: gw.base, registrationId, data: JSON.stringify(payload) });
    const shown = await page.waitForFunction(async () => {
      const list = await (await navigator.serviceWorker.ready).getNotifications();
      return list.length ? list.map((n) => ({ title: n.title, body: n.body, tag: n.tag, url: n.data?.url })) : null;
    }, null, { polling: 100 }).then((h) => h.jsonValue());
    assert.equal(shown.length, 1);
    assert.equal(shown[0].title, 'The agent asks for your permission');
    assert.equal(shown[0].tag, sessionId);
    assert.match(shown[0].body, /Read the workspace/);
    assert.equal(shown[0].url, `/?session=${sessionId}`);

    // Tapped: the page it opens shows the session, at the request.
    const opened = await v.newPage();
    await opened.goto(`${gw.base}${shown[0].url}`);
    await connected(opened);
    await opened.getByTestId('permission').filter({ hasText: 'Read the workspace' }).waitFor();
    assert.equal(new URL(opened.url()).search, '', 'the link is not left in the address bar');
    await opened.getByTestId('permission-option').and(opened.locator('[class*="kind-allow"]')).first().click();
    await opened.getByTestId('permission').first().waitFor({ state: 'detached' });
    await opened.close();
  });

  step('the device can be removed', async () => {
    await page.getByTestId('shortcuts-button').click();
    await page.getByTestId('push-device').getByRole('button').click();
    await page.getByTestId('push-device').waitFor({ state: 'detached' });
    await page.getByTestId('push-enable').waitFor();
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});
