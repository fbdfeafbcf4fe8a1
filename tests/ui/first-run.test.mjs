// The first minute of a new user (issue 11, "How we will judge it"): from starting the gateway as
// `cargo run --release` does, with no configuration at all, to a streamed, Markdown-rendered answer
// with a diff card on screen, in under a minute, on a desktop and on a phone-sized window.
//
// Each device gets its own fresh gateway, started exactly like a new user's: `acp-gateway serve`
// in an empty working directory, no config file, no ACP_GATEWAY_AGENT (the built-in demo agent in
// its showcase mode), no secret, no database URL (the defaults under ./data), only
// ACP_GATEWAY_LISTEN on a free port (the debug binary stands in for the release one). The user
// opens the login link it printed, types a prompt and presses Enter (taps Send on the phone); if
// the agent asks a permission, the user allows it. The clock runs from the gateway's start.
// Screenshots: screenshots/first-run-{desktop,phone}.png (the answer) and
// first-run-{desktop,phone}-diff.png (the diff card).
//
// Run: `cargo build && cd tests/ui && node --test first-run.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { DESKTOP, NO_ERRORS, PHONE, connected, openBrowser, startGateway, waitUntil } from './harness.mjs';

const BUDGET_MS = 60_000;
const PROMPT = 'Hi! Show me what you can do.';

/** A rendered Markdown block (not plain text) inside an agent message. */
const MARKDOWN = '[data-testid="message-agent"] :is(table, [data-testid="code-block"], pre code, h1, h2, h3)';
/** A tool card showing a diff: added or removed lines, not just the new text. */
const DIFF = '[data-testid="tool-call"] [data-testid="tool-diff"] [data-testid="diff-line"]:is([data-type="add"], [data-type="del"], [data-type="change"])';

describe('first run: a new user gets a Markdown answer and a diff card in under a minute', { timeout: 240_000 }, () => {
  let browser;
  const timings = [];

  before(async () => { browser = await openBrowser(); });
  after(async () => {
    await browser?.close().catch(() => {});
    for (const line of timings) process.stdout.write(`# ${line}\n`);
  });

  for (const [label, viewport] of [['desktop', DESKTOP], ['phone', PHONE]]) {
    it(`from start to answer on a ${label}`, async () => {
      const started = Date.now();
      const mark = () => ((Date.now() - started) / 1000).toFixed(1);
      const gw = await startGateway({ bare: true });
      try {
        const ready = mark();
        assert.ok(gw.loginUrl, `no login link in:\n${gw.stdout()}`);
        const v = await browser.open(gw, { ...viewport, signedIn: false, goto: false });
        const { page } = v;
        await page.goto(gw.loginUrl);
        await connected(page);
        const signedIn = mark();

        // Every length the newest agent message's text goes through: a streamed answer grows in steps.
        await page.evaluate(() => {
          const log = document.getElementById('log');
          const lengths = [];
          window.agentMessageLengths = lengths;
          new MutationObserver(() => {
            const messages = log.querySelectorAll('[data-testid="message-agent"]');
            const n = messages[messages.length - 1]?.textContent.length ?? 0;
            if (n && n !== lengths[lengths.length - 1]) lengths.push(n);
          }).observe(log, { childList: true, subtree: true, characterData: true });
        });

        const input = page.getByTestId('prompt-input');
        await input.click();
        await input.pressSequentially(PROMPT);
        if (viewport.isMobile) await page.getByTestId('send').tap();
        else await input.press('Enter');
        const sent = mark();

        // Watch for the answer; allow a permission request if the agent asks one (a new user would).
        let allowed = 0;
        const remaining = () => Math.max(1_000, BUDGET_MS - (Date.now() - started));
        await waitUntil('a Markdown answer and a diff card on screen', async () => {
          const allow = page.locator('#permissions [data-testid="permission-option"][class*="kind-allow"]').first();
          if (await allow.isVisible()) {
            await allow.click();
            allowed += 1;
          }
          return (await page.locator(MARKDOWN).first().isVisible()) && (await page.locator(DIFF).first().isVisible());
        }, { ms: remaining(), every: 100 }).catch(async (err) => {
          await v.shot(`first-run-${label}-failed`);
          const seen = `Markdown block ${await page.locator(MARKDOWN).count()}, diff lines ${await page.locator(DIFF).count()}, `
            + `tool cards ${await page.getByTestId('tool-call').count()}, agent messages ${await page.getByTestId('message-agent').count()}`;
          throw new Error(`${err.message} (on screen: ${seen}; screenshots/first-run-${label}-failed.png)`);
        });
        const answered = mark();
        const seconds = (Date.now() - started) / 1000;
        timings.push(`${label}: answer and diff card on screen ${seconds.toFixed(1)} s after the gateway started `
          + `(ready ${ready} s, signed in ${signedIn} s, prompt sent ${sent} s, answered ${answered} s; `
          + `${allowed} permission request(s) allowed)`);
        assert.ok(seconds < BUDGET_MS / 1000, `took ${seconds.toFixed(1)} s`);

        // The rest of the turn; the answer came in pieces, not in one block at the end.
        await page.getByTestId('send').waitFor();
        const steps = await page.evaluate(() => window.agentMessageLengths.length);
        timings.push(`${label}: the agent's answer grew in ${steps} steps on screen`);
        assert.ok(steps >= 3, `the answer was not streamed: it appeared in ${steps} step(s)`);

        // The screenshots the closing note shows.
        await v.shot(`first-run-${label}`);
        await page.locator(DIFF).first().scrollIntoViewIfNeeded();
        await v.shot(`first-run-${label}-diff`);
        assert.deepEqual(v.errors(), NO_ERRORS, 'page errors, console errors or CSP violations');
        await v.close();
      } finally {
        const { leaked } = await gw.dispose();
        assert.deepEqual(leaked, [], 'processes started by the gateway outlived it');
      }
    });
  }
});
