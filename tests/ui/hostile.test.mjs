// Hostile agent output never executes in the web UI (issue 11, item 7).
//
// The gateway's default agent is tests/agents/hostile_agent.py: every string it sends that the UI
// may render (Markdown and raw HTML in message, thought and user chunks, links, images, code
// blocks, tables, tool call titles / kinds / statuses / locations / diffs / terminal text with ANSI
// and OSC 8, image / resource content blocks, plan entries, the session title, modes, config
// options, slash commands, usage, permission options, the login card of an agent that wants one,
// folder names and a file in the workspace) carries payloads that, if they ran, would set
// `window.__pwned`, request `/pwned?…` and call `alert`; wrong JSON types and Markdown nested past
// the parser's recursion must not break rendering either. The test prompts (with payloads of its
// own), answers the permission requests, waits for the agent's end marker, and then checks the DOM,
// the network, dialogs, navigations, CSP and the console; clicks every agent link (a new tab on an
// http(s) URL, this page stays), opens the agent's file in the file viewer and its folders in the
// folder picker; then it reloads, replays the session (session/load: the same renderers on stored
// updates) and checks again. Desktop and phone.
//
// Run: `cargo build && cd tests/ui && node --test hostile.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, REPO, shutdown, startGateway, STEP_MS, waitUntil } from './harness.mjs';

const AGENT = `/usr/bin/python3 ${path.join(REPO, 'tests/agents/hostile_agent.py')}`;
const END_MARKER = 'HOSTILE-END-MARKER';
/** The prompt is hostile too: the user's own text goes through the same Markdown renderer. */
const PROMPT = [
  'hostile prompt',
  `[prompt link](javascript:window.__pwned='prompt-link';alert('prompt-link'))`,
  `<img src=x onerror="window.__pwned='prompt-img';fetch('/pwned?prompt-img')">`,
  '<script>window.__pwned="prompt-script"</script>',
].join('\n');

/** Tags that must never be in what the agent (or the user) wrote, wherever the UI puts it. */
const FORBIDDEN_TAGS = ['script', 'iframe', 'frame', 'frameset', 'object', 'embed', 'applet', 'form', 'style',
  'base', 'meta', 'link', 'noscript', 'template', 'foreignobject', 'animate', 'set', 'use', 'portal'];
/** Attributes that hold a URL. */
const URL_ATTRS = ['href', 'xlink:href', 'src', 'srcset', 'action', 'formaction', 'data', 'poster', 'background',
  'ping', 'cite', 'values', 'to', 'from', 'lowsrc', 'dynsrc'];

/**
 * Runs in the page: everything wrong with the rendered document, as strings. `regions` are the
 * selectors of the parts that show agent- or user-provided content.
 */
function scanPage({ forbidden, urlAttrs, regions }) {
  const problems = [];
  const describe = (el) => {
    const html = el.outerHTML ?? String(el);
    return `${html.slice(0, 160)}${html.length > 160 ? '…' : ''}`;
  };
  if (window.__pwned !== undefined) problems.push(`window.__pwned is ${String(window.__pwned)}`);
  if (typeof document.getElementById !== 'function') problems.push('document.getElementById is clobbered');
  const prompt = document.getElementById('prompt-input');
  if (prompt?.tagName !== 'TEXTAREA') problems.push(`#prompt-input is clobbered by ${prompt && describe(prompt)}`);
  // The head holds only the app's own files.
  for (const el of document.head.querySelectorAll('script, link, style, base, meta')) {
    const url = el.getAttribute('src') ?? el.getAttribute('href');
    if (el.tagName === 'STYLE' || el.tagName === 'BASE') problems.push(`<head> has ${describe(el)}`);
    if (url && new URL(url, location.href).origin !== location.origin) problems.push(`<head> loads ${url}`);
    if (el.tagName === 'META' && el.httpEquiv) problems.push(`<head> has ${describe(el)}`);
  }
  for (const el of document.body.querySelectorAll('base, meta, link, style, script')) {
    problems.push(`<body> has ${describe(el)}`);
  }
  const all = [...document.querySelectorAll('*')];
  const scheme = (value) => value.replace(/[\u0000-\u0020\u007f-\u009f]/g, '').toLowerCase();
  for (const el of all) {
    for (const attr of el.attributes) {
      const name = attr.name.toLowerCase();
      if (name.startsWith('on')) problems.push(`event handler attribute ${name} on ${describe(el)}`);
      if (urlAttrs.includes(name) || name === 'srcdoc') {
        const value = scheme(attr.value);
        if (name === 'srcdoc' || /^(javascript|vbscript|livescript|data:text|data:application)/.test(value)
          || /(^|,|\s)(javascript|vbscript):/.test(value)) {
          problems.push(`${name}=${attr.value.slice(0, 80)} on ${describe(el)}`);
        }
      }
    }
  }
  for (const region of document.querySelectorAll(regions.join(', '))) {
    for (const el of region.querySelectorAll(forbidden.join(', '))) problems.push(`${region.dataset.testid ?? region.id} has ${describe(el)}`);
    for (const el of region.querySelectorAll('input:not([type="checkbox"]), textarea, select, [autofocus]')) {
      // The app's own controls (mode / config pickers) are built with ids-free class names; an
      // agent-made control would carry the agent's name/value.
      if (el.closest('.msg-body, .tool-body, .plan, .permission-title')) problems.push(`${region.id} has a control ${describe(el)}`);
    }
    // Agent text may not set inline style (the app sets styles through the CSSOM on its own nodes).
    for (const el of region.querySelectorAll('[style]')) {
      const style = el.getAttribute('style');
      if (/url\(|fixed|expression|pwned|inset/i.test(style) || (style.trim() && el.closest('.msg-body'))) problems.push(`style="${style}" on ${describe(el)}`);
    }
    // An id in agent content that is also the app's own (or anyone else's) clobbers getElementById.
    for (const el of region.querySelectorAll('[id]')) {
      if (document.querySelectorAll(`[id="${CSS.escape(el.id)}"]`).length > 1) problems.push(`duplicate id ${el.id}: ${describe(el)}`);
    }
    for (const el of region.querySelectorAll('[name]')) {
      if (el.getAttribute('name') in document) problems.push(`name=${el.getAttribute('name')} clobbers document: ${describe(el)}`);
    }
    // Links: only http(s) (or mailto), opened in a new tab without an opener.
    for (const a of region.querySelectorAll('a[href], area[href]')) {
      const url = new URL(a.getAttribute('href'), location.href);
      if (url.protocol === 'mailto:') continue;
      if (!['http:', 'https:'].includes(url.protocol)) {
        problems.push(`link to ${url.protocol} ${describe(a)}`);
        continue;
      }
      if (url.origin === location.origin && url.pathname !== '/') problems.push(`same-origin link ${url.href} ${describe(a)}`);
      if (a.getAttribute('target') !== '_blank') problems.push(`link without target=_blank: ${describe(a)}`);
      if (!/\bnoopener\b/.test(a.getAttribute('rel') ?? '') && !/\bnoreferrer\b/.test(a.getAttribute('rel') ?? '')) {
        problems.push(`link without rel=noopener: ${describe(a)}`);
      }
    }
    // Images: only from here or data: image types (an SVG in <img> runs no script and loads nothing);
    // nothing remote (CSP would block and report it).
    for (const img of region.querySelectorAll('img[src], image, video, audio, source, picture')) {
      const src = img.getAttribute('src') ?? img.getAttribute('href') ?? '';
      if (!src) continue;
      const url = new URL(src, location.href);
      if (url.protocol === 'data:' ? !/^data:image\/(png|jpeg|gif|webp|avif|bmp|svg\+xml)[;,]/i.test(src) : url.origin !== location.origin) {
        problems.push(`media from ${src.slice(0, 80)}: ${describe(img)}`);
      }
    }
  }
  // Nothing may cover the page (a phishing overlay from agent CSS would need style or classes).
  return problems;
}

/** Runs in the page: what the document's head holds, but its title. */
function headFiles() {
  return [...document.head.children].filter((el) => el.tagName !== 'TITLE').map((el) => el.outerHTML);
}

/** Regions of the page that show what agents or users wrote. */
const REGIONS = ['#log', '#permissions', '#session-list', '.topbar', '#sidebar', '#composer',
  '[data-testid="file-viewer"]', '[data-testid="cwd-entries"]', '[data-testid="cwd-crumbs"]', '[data-testid="cwd-chosen"]'];

describe('hostile agent output never executes', { timeout: 300_000 }, () => {
  let gw;
  let browser;

  before(async () => {
    // A second agent that wants a login first: its auth methods and its refusal are hostile too.
    gw = await startGateway({
      agent: AGENT,
      config: [
        '[agents.login]',
        'command = "/usr/bin/python3"',
        `args = [${JSON.stringify(path.join(REPO, 'tests/agents/hostile_agent.py'))}]`,
        'env = { HOSTILE_REQUIRE_AUTH = "1" }',
        '',
      ].join('\n'),
    });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  it('shows a hostile agent\'s login card inertly', async () => {
    const v = await browser.open(gw, { ...DESKTOP, goto: false });
    const { page } = v;
    const dialogs = [];
    page.on('dialog', (dialog) => { dialogs.push(dialog.message()); dialog.dismiss().catch(() => {}); });
    await page.goto(`${gw.base}/`);
    await connected(page);
    await page.getByTestId('agent-select').selectOption('login');
    await connected(page);
    await page.getByTestId('new-session').click();
    const card = page.getByTestId('agent-auth');
    await card.waitFor();
    assert.deepEqual(await page.evaluate(scanPage, { forbidden: FORBIDDEN_TAGS, urlAttrs: URL_ATTRS, regions: REGIONS }), []);
    assert.equal(await card.locator('img, script, a, iframe, b').count(), 0, `HTML in ${await card.innerHTML()}`);
    await v.shot('hostile-agent-login');
    await page.getByTestId('auth-method').first().click();
    await card.waitFor({ state: 'detached' });
    await page.getByTestId('session-item').first().waitFor();
    assert.deepEqual(await page.evaluate(scanPage, { forbidden: FORBIDDEN_TAGS, urlAttrs: URL_ATTRS, regions: REGIONS }), []);
    assert.deepEqual(dialogs, []);
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  for (const [label, viewport] of [['desktop', DESKTOP], ['phone', PHONE]]) {
    it(`renders a hostile turn and its replay inertly (${label})`, async () => {
      const v = await browser.open(gw, { ...viewport, goto: false });
      const { page, context } = v;
      const pwned = []; // requests for /pwned* and /auth/login*
      const foreign = []; // requests that left the gateway's origin
      const dialogs = [];
      const navigations = [];
      const popups = [];
      let clicking = false;
      await context.route('**/pwned*', (route) => {
        pwned.push(route.request().url());
        return route.fulfill({ status: 404, body: 'no' });
      });
      // The page itself never asks for /auth/login once signed in; an agent's image must not spend a code.
      await context.route('**/auth/login*', (route) => {
        pwned.push(route.request().url());
        return route.fulfill({ status: 404, body: 'no' });
      });
      await context.route((url) => url.hostname.endsWith('example.invalid'), (route) => {
        if (!clicking || route.request().resourceType() !== 'document') foreign.push(route.request().url());
        return route.fulfill({ status: 200, contentType: 'text/plain', body: 'a page the agent linked to' });
      });
      context.on('request', (req) => {
        const url = new URL(req.url());
        if (url.origin !== gw.base && !['data:', 'blob:', 'about:'].includes(url.protocol) && !url.hostname.endsWith('example.invalid')) {
          foreign.push(req.url());
        }
      });
      context.on('page', (p) => { if (p !== page) popups.push(p); });
      page.on('dialog', (dialog) => { dialogs.push(`${dialog.type()}: ${dialog.message()}`); dialog.dismiss().catch(() => {}); });
      page.on('framenavigated', (frame) => { if (frame === page.mainFrame()) navigations.push(frame.url()); });

      await page.goto(`${gw.base}/`);
      await connected(page);
      const headBefore = await page.evaluate(headFiles);

      // A hostile turn, streamed live.
      await page.getByTestId('prompt-input').fill(PROMPT);
      await page.getByTestId('send').click();
      // Three permission requests (two with wrong JSON types): each is checked while on screen and
      // answered (`allow` where offered, else the first button), then the agent sends its end marker.
      const answered = [];
      const cardProblems = [];
      const seen = new Set(); // cards answered, by their heading's id
      await waitUntil('the permission requests answered and the end marker', async () => {
        const card = page.locator('#permissions [data-testid="permission"]').last();
        const cardId = await card.getAttribute('aria-labelledby', { timeout: 100 }).catch(() => null);
        if (cardId && !seen.has(cardId)) {
          seen.add(cardId);
          cardProblems.push(...await page.evaluate(scanPage, { forbidden: FORBIDDEN_TAGS, urlAttrs: URL_ATTRS, regions: ['#permissions'] }));
          if (await card.locator('img, script, a, iframe, b').count()) cardProblems.push(`HTML in ${await card.innerHTML()}`);
          const allow = card.locator('[data-option-id="allow"]');
          const button = (await allow.count()) ? allow.first() : card.locator('button').first();
          answered.push(await button.textContent());
          await button.click();
        }
        return page.locator('#log').getByText(END_MARKER).first().isVisible();
      }, { ms: 3 * STEP_MS }).catch(async (err) => {
        await v.shot(`hostile-${label}-failed`);
        throw new Error(`${err.message}\nanswered: ${JSON.stringify(answered)}\nerrors: ${JSON.stringify(v.errors(), null, 1)}`
          + `\n--- gateway log ---\n${gw.log().slice(-4000)}`);
      });
      assert.deepEqual(cardProblems, [], 'hostile content in a permission card');
      assert.equal(answered.length, 3, `permission requests answered: ${JSON.stringify(answered)}`);
      await page.getByTestId('send').waitFor();

      const check = async (when) => {
        // Let every image load or fail (an onerror would have fired by then; lazy ones are made eager,
        // as scrolling would) and two frames render.
        await page.evaluate(() => document.querySelectorAll('img[loading="lazy"]').forEach((img) => { img.loading = 'eager'; }));
        await waitUntil(`every image in the conversation to settle (${when})`,
          () => page.evaluate(() => [...document.querySelectorAll('#log img')].every((img) => img.complete)), { ms: STEP_MS });
        await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
        const problems = await page.evaluate(scanPage, { forbidden: FORBIDDEN_TAGS, urlAttrs: URL_ATTRS, regions: REGIONS });
        assert.deepEqual(problems, [], `hostile content got through (${when})`);
        assert.deepEqual(await page.evaluate(headFiles), headBefore, `<head> changed (${when})`);
        assert.deepEqual(pwned, [], `payloads reached the network (${when})`);
        assert.deepEqual(foreign, [], `requests left the gateway's origin (${when})`);
        assert.deepEqual(dialogs, [], `payloads opened dialogs (${when})`);
        assert.deepEqual(navigations.filter((url) => url !== `${gw.base}/`), [], `the page navigated (${when})`);
        assert.deepEqual(v.errors(), NO_ERRORS, `page errors, console errors or CSP violations (${when})`);
      };

      // The agent's slash commands, as the prompt box completes them.
      await page.getByTestId('prompt-input').fill('/');
      await page.getByTestId('slash-option').first().waitFor();
      await check('live, slash commands open');
      await page.getByTestId('prompt-input').fill('');

      await check('live');
      await v.shot(`hostile-${label}`);

      // Every visible link in the conversation opens an http(s) page in a new tab and leaves this
      // page where it is.
      clicking = true;
      await page.evaluate(() => document.querySelectorAll('#log details').forEach((d) => { d.open = true; })); // folded thoughts
      const links = page.locator('#log a[href]');
      const count = await links.count();
      let clicked = 0;
      for (let i = 0; i < count; i += 1) {
        const link = links.nth(i);
        if (!(await link.isVisible())) continue;
        const href = await link.getAttribute('href');
        if (href.startsWith('mailto:')) continue; // opens the mail app, not a page
        await link.scrollIntoViewIfNeeded();
        const [popup] = await Promise.all([
          context.waitForEvent('page', { timeout: STEP_MS }).catch(() => { throw new Error(`clicking ${href} opened no tab`); }),
          link.click(),
        ]);
        await popup.waitForLoadState('commit');
        const opened = new URL(popup.url());
        assert.ok(['http:', 'https:', 'mailto:'].includes(opened.protocol), `link ${href} opened ${popup.url()}`);
        assert.equal(page.url(), `${gw.base}/`, `clicking ${href} navigated the page`);
        await popup.close();
        clicked += 1;
      }
      clicking = false;
      process.stdout.write(`# ${label}: ${count} links in the conversation, ${clicked} visible http(s) ones clicked\n`);
      assert.ok(clicked > 0, 'no link to click: the safe links were not rendered as links');

      // The agent's file (payloads in an .html file with an HTML name) in the file viewer.
      const scan = () => page.evaluate(scanPage, { forbidden: FORBIDDEN_TAGS, urlAttrs: URL_ATTRS, regions: REGIONS });
      await page.locator('[data-testid="tool-location"][data-path$="hostile <img src=x onerror=alert(1)>.html"]').first().click();
      await page.locator('[data-testid="file-viewer"][data-state="ready"]').waitFor();
      assert.match(await page.getByTestId('file-viewer-body').textContent(), /<script>window.__pwned='file-script'/);
      assert.deepEqual(await scan(), [], 'hostile content in the file viewer');
      await v.shot(`hostile-${label}-file`);
      await page.getByTestId('file-viewer-close').click();

      // Folders the agent named with HTML, in the cwd picker.
      // Nothing the agent sent widens the page (a phone would zoom out to show it).
      assert.deepEqual(await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]),
        [viewport.width, viewport.width], 'the page is wider than the screen');
      if (!(await page.getByTestId('cwd-browse').isVisible())) await page.getByTestId('sidebar-toggle').click();
      await page.getByTestId('cwd-browse').click();
      await page.getByTestId('cwd-entry').filter({ hasText: 'javascript:alert(1)' }).waitFor();
      assert.equal(await page.getByTestId('cwd-entry').filter({ hasText: '<img src=x onerror=alert(1)>' }).count(), 1);
      assert.deepEqual(await scan(), [], 'hostile content in the folder picker');
      await v.shot(`hostile-${label}-folders`);
      await page.getByTestId('cwd-cancel').click();
      await check('after the viewer and the picker');

      // Reload and replay the stored transcript through the same renderers.
      const sessionId = await page.locator('[data-testid="session-item"]:has([aria-current="true"])').getAttribute('data-session-id');
      assert.ok(sessionId, 'the current session is not marked in the list');
      await page.reload();
      await connected(page);
      const open = page.locator(`[data-testid="session-item"][data-session-id="${sessionId}"] .session-open`);
      await open.waitFor({ state: 'attached' });
      if (!(await open.isVisible())) await page.getByTestId('sidebar-toggle').click(); // the phone's drawer
      await open.click();
      await page.locator('#log').getByText(END_MARKER).first().waitFor();
      await page.locator('#log').getByText('hostile prompt').first().waitFor();
      await check('replayed');
      await v.shot(`hostile-${label}-replayed`);
      await v.close();
    });
  }
});
