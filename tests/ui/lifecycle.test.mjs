// A session's whole life (issue 21): the current session downloaded from the topbar's menu as
// Markdown and as JSON Lines, holding what the conversation showed; archived from the list and
// restored from the archive view; forked from an answer, each branch going on alone. Phone-sized;
// screenshots download-phone.png, archived-phone.png, fork-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test lifecycle.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { connected, NO_ERRORS, openBrowser, PHONE, scenario, shutdown, startGateway } from './harness.mjs';

describe('a session downloaded from the browser', { timeout: 180_000 }, () => {
  let gw;
  let browser;
  let v;
  let page;
  const step = scenario(async () => {
    await v?.shot('lifecycle-failure', page).catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--delay-us', '0', '--chunks', '2'] });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  const download = async (testid) => {
    await page.getByTestId('session-download').locator('summary').click();
    const [file] = await Promise.all([page.waitForEvent('download'), page.getByTestId(testid).click()]);
    return { name: file.suggestedFilename(), text: await readFile(await file.path(), 'utf8') };
  };

  step('no session, nothing to download', async () => {
    v = await browser.open(gw, PHONE);
    page = v.page;
    await connected(page);
    assert.equal(await page.getByTestId('session-download').isHidden(), true);
  });

  step('the conversation downloads as Markdown and as JSON Lines', async () => {
    await page.getByTestId('prompt-input').fill('Write me a haiku about exports');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('send').waitFor(); // the turn is over
    await page.getByTestId('session-download').waitFor();
    await page.getByTestId('session-download').locator('summary').click();
    await v.shot('download-phone', page);
    await page.getByTestId('session-download').locator('summary').click();

    const md = await download('download-markdown');
    assert.match(md.name, /^write-me-a-haiku-about-exports-[0-9a-f-]+\.md$/);
    assert.match(md.text, /^# Write me a haiku about exports\n/);
    assert.match(md.text, /## User · .*\n\nWrite me a haiku about exports\n/);
    assert.match(md.text, /## Agent · /);
    const said = 'chunk 2/2: you said: Write me a haiku about exports';
    assert.match(await page.getByTestId('message-agent').last().innerText(), new RegExp(said.replace(/[/]/g, '\\/')));
    assert.ok(md.text.includes(`${said}\n`), `the agent's answer is in the file:\n${md.text}`);
    assert.match(md.text, /\*\*Tool call:\*\* Think about the prompt — completed/);

    const jsonl = await download('download-jsonl');
    assert.match(jsonl.name, /\.jsonl$/);
    const lines = jsonl.text.trim().split('\n').map((l) => JSON.parse(l));
    assert.deepEqual(lines.map((l) => l.seq), lines.map((_, i) => i + 1), 'every update, numbered from 1');
    assert.equal(lines[0].update.sessionUpdate, 'user_message_chunk');
    assert.ok(lines.every((l) => !Number.isNaN(Date.parse(l.time))));
    assert.equal(await page.getByTestId('session-download').evaluate((d) => d.open), false, 'the menu closes');
    assert.deepEqual(v.errors(), NO_ERRORS);
  });

  step('archived, it leaves the list; the archive view lists it and restores it', async () => {
    await page.getByTestId('sidebar-toggle').click(); // the phone's drawer
    const items = page.getByTestId('session-list').getByTestId('session-item');
    await items.first().waitFor();
    assert.equal(await items.count(), 1);
    await items.first().getByTestId('session-archive').click();
    await page.getByTestId('session-list').getByTestId('session-item').first().waitFor({ state: 'detached' });
    await page.getByTestId('archive-toggle').click();
    await items.first().getByTestId('session-restore').waitFor();
    assert.match(await items.first().innerText(), /Write me a haiku about exports/);
    assert.equal(await page.getByTestId('archive-toggle').getAttribute('aria-pressed'), 'true');
    await v.shot('archived-phone', page);
    await items.first().getByTestId('session-restore').click();
    await items.first().waitFor({ state: 'detached' });
    assert.equal(await page.locator('#session-empty').innerText(), 'No archived sessions.');
    await page.getByTestId('archive-toggle').click();
    await items.first().getByTestId('session-archive').waitFor();
    assert.equal(await items.count(), 1);
    await items.first().locator('.session-open').click(); // closes the drawer
    assert.deepEqual(v.errors(), NO_ERRORS);
  });

  step('"Fork from here" on an answer opens a new session with the conversation up to it', async () => {
    await page.getByTestId('prompt-input').fill('A second question');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('message-agent').filter({ hasText: 'you said: A second question' }).first().waitFor();
    await page.getByTestId('send').waitFor();
    const firstAnswer = page.locator('.msg-agent').first();
    await firstAnswer.getByTestId('fork-here').click();
    await page.getByTestId('session-title').filter({ hasText: 'Write me a haiku about exports (fork)' }).waitFor();
    await page.getByTestId('message-agent').first().filter({ hasText: 'you said: Write me a haiku about exports' }).waitFor();
    assert.equal(await page.getByText('A second question').count(), 0, 'the fork stops before the second prompt');
    await page.getByTestId('prompt-input').fill('Only in the fork');
    await page.getByTestId('prompt-input').press('Enter');
    await page.getByTestId('message-agent').filter({ hasText: 'you said: Only in the fork' }).first().waitFor();
    await page.getByTestId('send').waitFor();
    await page.locator('.msg-agent').first().scrollIntoViewIfNeeded();
    await v.shot('fork-phone', page);
    // Both are listed; the original still has its second question and not the fork's prompt.
    await page.getByTestId('sidebar-toggle').click();
    const items = page.getByTestId('session-list').getByTestId('session-item');
    assert.equal(await items.count(), 2);
    await items.filter({ hasNotText: '(fork)' }).locator('.session-open').click();
    await page.getByTestId('message-agent').filter({ hasText: 'you said: A second question' }).first().waitFor();
    assert.equal(await page.getByText('Only in the fork').count(), 0);
    assert.deepEqual(v.errors(), NO_ERRORS);
  });
});
