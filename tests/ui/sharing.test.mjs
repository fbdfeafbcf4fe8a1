// Sharing a session (issue 21, item 4): the owner makes a link from the topbar's Share dialog,
// which says what a controller can do, shares as an observer unless told otherwise, takes a
// confirmation for a controller and ends a controller link after a day (security review F4); a
// teammate opens it in another browser context, signed in as someone else, and observes the
// session read-only while the owner's next turn arrives live; a controller shared by name finds
// the session under "Shared with you" and prompts it; the owner revokes the link, and the
// observer's page says the session is no longer shared. On an agent that holds the owner's
// stored key, a controller's prompt is refused with the reason on their page and their text
// back in the box. Screenshots share-dialog.png, share-dialog-controller.png,
// shared-observer-phone.png, shared-keys-withheld.png.
//
// Run: `cargo build && cd tests/ui && node --test sharing.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { axeScan, connected, NO_ERRORS, openBrowser, PHONE, DESKTOP, REPO, scenario, shutdown, startGateway } from './harness.mjs';

const KEYS_AGENT = path.join(REPO, 'tests/agents/keys_agent.py');

/** What axe finds that blocks (serious or critical), as the a11y suite counts it. */
const blocking = async (page) => (await axeScan(page)).filter((v) => ['serious', 'critical'].includes(v.impact));

describe('a session shared with teammates', { timeout: 180_000 }, () => {
  let gw;
  let browser;
  let owner;
  let viewer;
  let link;
  const step = scenario(async () => {
    await owner?.shot('sharing-failure-owner').catch(() => {});
    await viewer?.shot('sharing-failure-viewer').catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--delay-us', '0', '--chunks', '2'] });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  step('the owner makes a link from the Share dialog', async () => {
    owner = await browser.open(gw, { user: 'alice', ...DESKTOP });
    const page = owner.page;
    await connected(page);
    assert.equal(await page.getByTestId('share-open').isHidden(), true, 'nothing to share yet');
    await page.getByTestId('prompt-input').fill('Plan the release');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('send').waitFor();
    await page.getByTestId('message-agent').first().waitFor();
    await page.getByTestId('share-open').click();
    await page.getByTestId('share-dialog').waitFor();
    assert.match(await page.getByTestId('share-roles').innerText(), /controller also prompts your agent, which runs commands as you, with your keys and files/);
    assert.equal(await page.getByTestId('share-role').inputValue(), 'observer', 'observer unless told otherwise');
    assert.equal(await page.getByTestId('share-warning').isHidden(), true);
    await page.getByTestId('share-submit').click();
    link = await page.getByTestId('share-link').inputValue();
    assert.match(link, /^http:\/\/127\.0\.0\.1:\d+\/#share=acpshare_[\w-]+$/);
    await owner.shot('share-dialog');
    await page.getByTestId('share-row').first().waitFor();
    assert.match(await page.getByTestId('share-row').first().innerText(), /Link \(0 opened\) · observer · until revoked/);
    // A controller, by name: said plainly, and not made until the owner confirms it.
    await page.getByTestId('share-user').fill('carol');
    await page.getByTestId('share-role').selectOption('controller');
    assert.match(await page.getByTestId('share-warning').innerText(), /A controller runs commands as you, with your keys and files/);
    assert.equal(await page.getByTestId('share-expiry').inputValue(), '', 'a share by name may last until revoked');
    await owner.shot('share-dialog-controller');
    assert.deepEqual(await blocking(page), [], 'the controller warning: no serious or critical axe violations');
    await page.getByTestId('share-submit').click();
    assert.equal(await page.getByTestId('share-confirm').evaluate((e) => e.validity.valueMissing), true, 'the form asks for the confirmation');
    assert.equal(await page.getByTestId('share-row').count(), 1, 'nothing made before it');
    await page.getByTestId('share-confirm').check();
    await page.getByTestId('share-submit').click();
    await page.getByTestId('share-row').nth(1).waitFor();
    assert.match(await page.getByTestId('share-row').nth(1).innerText(), /carol · controller · until revoked/);
    assert.equal(await page.getByTestId('share-role').inputValue(), 'observer', 'back to observer for the next one');
    // A controller link ends after a day unless another end is chosen; never "until revoked".
    await page.getByTestId('share-role').selectOption('controller');
    assert.equal(await page.getByTestId('share-expiry').inputValue(), '86400');
    assert.equal(await page.getByTestId('share-expiry').locator('option[value=""]').isDisabled(), true);
    await page.getByTestId('share-confirm').check();
    await page.getByTestId('share-submit').click();
    const controllerRow = page.getByTestId('share-row').filter({ hasText: /Link \(0 opened\) · controller · ends / });
    await controllerRow.waitFor();
    await page.getByTestId('share-link').waitFor();
    await controllerRow.getByTestId('share-revoke').click();
    await controllerRow.waitFor({ state: 'detached' });
    assert.deepEqual(await blocking(page), [], 'the Share dialog: no serious or critical axe violations');
    await page.getByTestId('share-close').click();
    assert.deepEqual(owner.errors(), NO_ERRORS);
  });

  step('another user opens the link and observes, read-only, live', async () => {
    viewer = await browser.open(gw, { user: 'bob', goto: false, ...PHONE });
    const page = viewer.page;
    await page.goto(link);
    await connected(page);
    await page.getByTestId('share-badge').waitFor();
    assert.equal(await page.getByTestId('share-badge').innerText(), 'Observing alice’s session');
    assert.equal(new URL(page.url()).hash, '', 'the token leaves the address bar');
    await page.getByTestId('message-agent').first().waitFor();
    assert.match(await page.getByTestId('message-agent').first().innerText(), /you said: Plan the release/);
    assert.equal(await page.getByTestId('prompt-input').isDisabled(), true);
    assert.match(await page.getByTestId('prompt-input').getAttribute('placeholder'), /observing alice’s session/);
    assert.equal(await page.getByTestId('share-open').isHidden(), true, 'not theirs to share');
    assert.equal(await page.getByTestId('session-download').isHidden(), true, 'not theirs to download');
    assert.equal(await page.getByTestId('fork-here').count(), 0, 'not theirs to fork');

    // The owner's next turn reaches the observer as it happens.
    await owner.page.getByTestId('prompt-input').fill('Now write the changelog');
    await owner.page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('message-agent').filter({ hasText: 'you said: Now write the changelog' }).waitFor();
    await viewer.shot('shared-observer-phone');
    assert.deepEqual(await blocking(page), [], 'the observer\'s page: no serious or critical axe violations');
    assert.deepEqual(viewer.errors(), NO_ERRORS);
  });

  step('a controller shared by name finds it under "Shared with you" and prompts', async () => {
    const carol = await browser.open(gw, { user: 'carol', ...DESKTOP });
    const page = carol.page;
    await connected(page);
    await page.getByTestId('shared-session').first().waitFor();
    await page.getByTestId('shared-session').first().click();
    await page.getByTestId('share-badge').waitFor();
    assert.equal(await page.getByTestId('share-badge').innerText(), 'Controlling alice’s session');
    await page.getByTestId('message-agent').filter({ hasText: 'you said: Plan the release' }).waitFor();
    assert.equal(await page.getByTestId('prompt-input').isDisabled(), false);
    await page.getByTestId('prompt-input').fill('Carol adds a note');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('message-agent').filter({ hasText: 'you said: Carol adds a note' }).waitFor();
    // The owner and the observer see carol's turn too.
    await owner.page.getByTestId('message-agent').filter({ hasText: 'you said: Carol adds a note' }).waitFor();
    await viewer.page.getByTestId('message-agent').filter({ hasText: 'you said: Carol adds a note' }).waitFor();
    assert.deepEqual(carol.errors(), NO_ERRORS);
    await carol.close();
  });

  step('revoked, the link no longer lets the observer in', async () => {
    const page = owner.page;
    await page.getByTestId('share-open').click();
    const row = page.getByTestId('share-row').filter({ hasText: 'Link (1 opened)' });
    await row.waitFor();
    await row.getByTestId('share-revoke').click();
    await row.waitFor({ state: 'detached' });
    await page.getByTestId('share-close').click();
    await viewer.page.getByTestId('error-banner').filter({ hasText: 'no longer shared with you' }).waitFor();
  });
});

describe('a controller on an agent holding the owner\'s key', { timeout: 120_000 }, () => {
  let gw;
  let browser;
  let carol;
  const step = scenario(async () => {
    await carol?.shot('sharing-keys-failure').catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${KEYS_AGENT}` });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  step('is refused, told why, and keeps the text', async () => {
    const api = async (user, method, route, body) => {
      const res = await fetch(`${gw.base}${route}`, {
        method, headers: { authorization: `Bearer ${await gw.token(user)}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      if (!res.ok) assert.fail(`${method} ${route}: ${res.status} ${await res.text()}`);
      return res.status === 204 ? null : res.json();
    };
    await api('alice', 'PUT', '/api/agents/default/keys', { methodId: 'openai-key', vars: { OPENAI_API_KEY: 'sk-alice-ui-9876' } });
    const owner = await browser.open(gw, { user: 'alice', ...DESKTOP });
    await connected(owner.page);
    await owner.page.getByTestId('prompt-input').fill('Alice asks');
    await owner.page.getByTestId('prompt-input').press('Enter');
    await owner.page.getByTestId('message-agent').first().waitFor();
    const sessionId = (await api('alice', 'GET', '/api/sessions')).sessions[0].sessionId;
    await api('alice', 'POST', `/api/sessions/${sessionId}/shares`, { role: 'controller', user: 'carol' });

    carol = await browser.open(gw, { user: 'carol', ...DESKTOP });
    const page = carol.page;
    await connected(page);
    await page.getByTestId('shared-session').first().click();
    await page.getByTestId('share-badge').waitFor();
    await page.getByTestId('prompt-input').fill('print OPENAI_API_KEY');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('error-banner').filter({ hasText: 'alice\'s agent for this session runs with the agent keys alice stored, and your share does not lend them' }).waitFor();
    assert.equal(await page.getByTestId('prompt-input').inputValue(), 'print OPENAI_API_KEY', 'the text is back in the box');
    await carol.shot('shared-keys-withheld');
    assert.equal(await owner.page.getByTestId('message-user').filter({ hasText: 'print OPENAI_API_KEY' }).count(), 0, 'nothing reached the owner');
    assert.deepEqual(carol.errors().page, []);
  });
});
