// Messages (issue 11, item 1): agent and user text as Markdown (CommonMark + GFM: headings, tables,
// task lists), highlighted code blocks with a working Copy button, thoughts folded away once the
// answer starts, non-text content blocks, and a 5,000-chunk reply that streams without long
// main-thread tasks. Desktop and phone, against `demo-agent --showcase`; the long turn uses the
// plain demo agent. Screenshots: messages-desktop.png, messages-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test messages.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { BINARY, connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, shutdown, startGateway, STEP_MS, waitUntil } from './harness.mjs';

/** The user's prompt is Markdown too. */
const PROMPT = 'Show me a **Markdown** answer\n\n- [x] a rendered prompt\n- [ ] with `inline code`';
const LONG_CHUNKS = 5000;
/** Budgets for the long turn, far above what it takes on an idle machine (about 1.5 s, no task over 100 ms). */
const LONG_TURN_MS = 20_000;
const LONGEST_TASK_MS = 500;

/** Collects 'longtask' entries (tasks over 50 ms) in the page from now on. */
function watchLongTasks() {
  window.longTasks = [];
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.longTasks.push(Math.round(entry.duration));
  }).observe({ type: 'longtask' });
}

/** Scrolls the conversation (only) so that `locator` is at its top, and lets two frames render. */
async function scrollTo(page, locator) {
  await locator.evaluate((node) => {
    const log = node.closest('[role="log"]');
    log.scrollTop += node.getBoundingClientRect().top - log.getBoundingClientRect().top - 8;
  });
  await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
}

const summary = (tasks) => `${tasks.length} long tasks, longest ${Math.max(0, ...tasks)} ms, ${tasks.reduce((a, b) => a + b, 0)} ms in all`;

describe('messages: Markdown, code blocks, thoughts, content blocks, long turns', { timeout: 300_000 }, () => {
  let gw;
  let browser;

  before(async () => {
    gw = await startGateway({
      agent: ['demo-agent', '--showcase', '--delay-us', '2000'],
      config: [
        '[agents.plain]',
        `command = ${JSON.stringify(BINARY)}`,
        'args = ["demo-agent", "--delay-us", "0"]',
        '',
      ].join('\n'),
    });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  for (const [label, viewport] of [['desktop', DESKTOP], ['phone', PHONE]]) {
    it(`renders a showcase turn as Markdown with highlighted, copyable code (${label})`, async () => {
      const v = await browser.open(gw, viewport);
      const { page, context } = v;
      await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: gw.base });
      await connected(page);

      // Sending without a session starts one (the phone's sidebar stays closed).
      await page.getByTestId('prompt-input').fill(PROMPT);
      await page.getByTestId('send').click();
      const user = page.getByTestId('message-user');
      await user.locator('strong', { hasText: 'Markdown' }).waitFor();
      assert.equal(await user.locator('li.task input[type="checkbox"][disabled]').count(), 2);
      assert.equal(await user.locator('code', { hasText: 'inline code' }).count(), 1);

      // The showcase thinks before it acts.
      const thought = page.getByTestId('thought').first();
      await thought.waitFor();

      const answer = page.getByTestId('message-agent').filter({ has: page.getByTestId('code-block') }).last();
      await answer.waitFor({ timeout: 60_000 });
      await page.getByTestId('send').waitFor({ timeout: 60_000 }); // the turn is over
      assert.equal(await user.count(), 1, 'the echoed prompt was rendered twice');

      // Markdown: a heading, a GFM table, a task list, a link that opens a new tab without an opener.
      assert.ok(await answer.locator('h2').count() >= 1, 'no heading');
      const table = answer.locator('.md-table table');
      assert.ok(await table.count() >= 1, 'no table');
      assert.ok(await table.first().locator('thead th').count() >= 2, 'table without a header row');
      assert.ok(await table.first().locator('tbody tr').count() >= 2, 'table without rows');
      const tasks = answer.locator('li.task input[type="checkbox"]');
      assert.ok(await tasks.count() >= 2, 'no task list');
      assert.equal(await answer.locator('li.task input[type="checkbox"]:not([disabled])').count(), 0, 'an editable checkbox');
      assert.ok(await answer.locator('li.task input:checked').count() >= 1, 'no checked task');
      const link = answer.locator('a[href^="http"]').first();
      assert.equal(await link.getAttribute('target'), '_blank');
      assert.equal(await link.getAttribute('rel'), 'noopener noreferrer nofollow');
      assert.equal(await answer.locator('[style], script, iframe').count(), 0);

      // The rust block: highlighted by hljs, labelled, and its Copy button copies exactly the code.
      const block = answer.locator('[data-testid="code-block"][data-lang="rust"]').first();
      await block.waitFor();
      assert.ok(await block.locator('code.hljs .hljs-keyword').count() >= 1, 'the rust block is not highlighted');
      assert.equal(await block.locator('.code-lang').textContent(), 'rust');
      const code = await block.locator('code').textContent();
      assert.match(code, /fn /);
      const copy = block.getByRole('button', { name: 'Copy rust code' });
      await copy.click();
      await block.getByRole('button', { name: 'Copied' }).waitFor();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), code);

      // Thoughts: folded away once the answer started, with how long they took; opening one shows it.
      const thoughts = page.getByTestId('thought');
      for (let i = 0; i < await thoughts.count(); i += 1) {
        assert.equal(await thoughts.nth(i).evaluate((d) => d.open), false, `thought ${i} is still open`);
        assert.match(await thoughts.nth(i).getByTestId('thought-summary').textContent(), /^Thought( for \d+s)?$/);
      }
      await thought.getByTestId('thought-summary').click();
      await thought.getByTestId('message-thought').waitFor();
      assert.ok((await thought.getByTestId('message-thought').textContent()).trim().length > 0, 'an empty thought');

      // Nothing is wider than the window: wide code and tables scroll inside their own boxes.
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px`);
      const box = await answer.boundingBox();
      assert.ok(box.x >= 0 && box.x + box.width <= viewport.width + 1, `the answer does not fit: ${JSON.stringify(box)}`);

      await scrollTo(page, thought);
      await v.shot(`messages-${label}-prompt`);
      await scrollTo(page, answer);
      await v.shot(`messages-${label}`);
      assert.deepEqual(v.errors(), NO_ERRORS);
      await v.close();
    });
  }

  it('streams a thought open, saying "Thinking…", and folds it when it is over', async () => {
    // The showcase's thought is one chunk, often folded in the frame it arrives in: drive a
    // thought bubble (static/js/message.js) directly, in the page.
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    const states = await page.evaluate(async () => {
      const { Message } = await import('/js/message.js');
      const message = new Message('thought', 'Agent (thinking)');
      document.getElementById('log').append(message.root);
      const state = () => ({ open: message.root.open, summary: message.root.querySelector('summary').textContent, text: message.body.textContent.trim() });
      message.write('Reading **the file**');
      message.render();
      const streaming = state();
      message.write(' first.');
      message.render();
      message.finish();
      const over = state();
      message.root.remove();
      return { streaming, over };
    });
    assert.deepEqual(states.streaming, { open: true, summary: 'Thinking…', text: 'Reading the file' });
    assert.deepEqual(states.over, { open: false, summary: 'Thought', text: 'Reading the file first.' });
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  it('shows image, resource, resource_link and audio blocks, and sanitizes by design', async () => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    // A 1x1 PNG.
    const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=';
    const found = await page.evaluate(async (data) => {
      const { contentBlock } = await import('/js/content.js');
      const { renderMarkdown } = await import('/js/markdown.js');
      const box = document.createElement('div');
      document.getElementById('log').append(box);
      const show = (node) => { const wrap = document.createElement('div'); wrap.append(node); box.append(wrap); return wrap; };
      const image = show(contentBlock({ type: 'image', mimeType: 'image/png', data, uri: 'file:///tmp/dot.png' }));
      const badImage = show(contentBlock({ type: 'image', mimeType: 'text/html', data: 'PHNjcmlwdD4=' }));
      const web = show(contentBlock({ type: 'resource_link', uri: 'https://example.com/spec.pdf', name: 'spec.pdf', title: 'The spec', size: 123456 }));
      const file = show(contentBlock({ type: 'resource_link', uri: 'javascript:alert(1)', name: 'evil' }));
      const text = show(contentBlock({ type: 'resource', resource: { uri: 'file:///src/main.rs', text: 'fn main() {}\n', mimeType: 'text/x-rust' } }));
      const blob = show(contentBlock({ type: 'resource', resource: { uri: 'file:///a.bin', blob: 'AAAA', mimeType: 'application/octet-stream' } }));
      const audio = show(contentBlock({ type: 'audio', mimeType: 'audio/wav', data: 'UklGRg==' }));
      await new Promise((resolve) => { const img = image.querySelector('img'); if (img.complete) resolve(); else img.onload = img.onerror = resolve; });
      const md = (src) => { const wrap = document.createElement('div'); wrap.append(renderMarkdown(src)); return wrap; };
      const hostile = md('[x](javascript:alert(1)) [y](data:text/html,hi) <img src=x onerror=alert(1)> <script>alert(1)</script> '
        + '<b onclick="alert(1)" style="color:red">bold</b> ![remote](https://example.com/a.png) ![ok](data:image/png;base64,' + data + ') Vec<String>');
      const result = {
        image: { src: image.querySelector('img')?.getAttribute('src').slice(0, 22), loaded: image.querySelector('img')?.naturalWidth, alt: image.querySelector('img')?.alt },
        badImage: badImage.querySelector('img') === null && badImage.textContent,
        web: { href: web.querySelector('a')?.href, target: web.querySelector('a')?.target, text: web.textContent },
        file: { links: file.querySelectorAll('a').length, text: file.textContent },
        text: { details: !!text.querySelector('details'), code: text.querySelector('code.hljs')?.textContent, uri: text.querySelector('summary')?.textContent },
        blob: { links: blob.querySelectorAll('a').length, text: blob.textContent },
        audio: { players: audio.querySelectorAll('audio').length, text: audio.textContent },
        hostile: {
          links: [...hostile.querySelectorAll('a')].map((a) => `${a.textContent} ${a.getAttribute('href')}`),
          images: [...hostile.querySelectorAll('img')].map((i) => i.getAttribute('src').slice(0, 14)),
          bold: hostile.querySelector('b')?.outerHTML,
          text: hostile.textContent,
          bad: hostile.querySelectorAll('script, [onclick], [onerror], [style]').length,
        },
      };
      box.remove();
      return result;
    }, png);
    assert.deepEqual(found.image, { src: 'data:image/png;base64,', loaded: 1, alt: 'Image: dot.png' });
    assert.match(found.badImage, /image text\/html not shown/);
    assert.deepEqual(found.web, { href: 'https://example.com/spec.pdf', target: '_blank', text: '📎The spec 121 KB' });
    assert.equal(found.file.links, 0);
    assert.match(found.file.text, /evil \(javascript:alert\(1\)\)/);
    assert.deepEqual(found.text, { details: true, code: 'fn main() {}\n', uri: '📄file:///src/main.rs 13 bytes' });
    assert.equal(found.blob.links, 0);
    assert.match(found.blob.text, /file:\/\/\/a\.bin \(application\/octet-stream, 3 bytes\)/);
    assert.equal(found.audio.players, 0);
    assert.match(found.audio.text, /Audio clip \(audio\/wav, 6 bytes\)/);
    assert.deepEqual(found.hostile.links, ['remote https://example.com/a.png']);
    assert.deepEqual(found.hostile.images, ['data:image/png']);
    assert.equal(found.hostile.bold, '<b>bold</b>');
    assert.equal(found.hostile.bad, 0);
    assert.match(found.hostile.text, /<img src=x onerror=alert\(1\)> <script>alert\(1\)<\/script>/);
    assert.match(found.hostile.text, /Vec<String>/);
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  it('streams Markdown cut anywhere to the same DOM as rendering it whole', async () => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    const outcomes = await page.evaluate(async () => {
      const { MarkdownStream, renderMarkdown } = await import('/js/markdown.js');
      let code = '';
      for (let i = 0; i < 150; i += 1) code += `    let value_${i} = compute(${i}); // line ${i}\n`;
      // Blank lines inside fences, <details>, loose lists and indented code, a fence right after a
      // paragraph and one inside a list item, a fence long enough to stream as plain text until it closes; five times over,
      // so that the stream also forgets settled text on the way (past 32,000 characters).
      const part = [
        '| a | b |', '|---|---|', '| 1 | 2 |', '', '- [x] done', '- [ ] todo', '',
        '```rust', 'fn main() {', '    println!("hi");', '', '    let x = 1;', '}', '```', 'Right after a fence.', '',
        '> quote', '> more', '', '1. one', '2. two', '   ```js', '   let a = 1;', '', '   let b = 2;', '   ```', '3. three', '',
        '<details>', '<summary>More</summary>', '', 'Hidden *text*.', '', '</details>', '',
        '- loose one', '', '- loose two', '', '  still item two', '', '1. first', '', '2. second', '',
        'Before indented code:', '', '    indented code', '', '    more of it', '',
        '```rust', 'fn long() {', code + '}', '```', '', '~~~', 'plain tilde', '~~~', '',
      ].join('\n');
      const doc = `# Title\n\nSome *text* with \`code\` and a [link](https://example.com).\nSecond line.\n\n${
        part.repeat(5)}Final paragraph\nspanning lines.`;
      const whole = document.createElement('div');
      whole.append(renderMarkdown(doc));
      let seed = 7;
      const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
      const outcomes = [];
      // [longest chunk, chunks per frame]
      for (const [longest, perFrame] of [[1, 50], [3, 1], [20, 3], [200, 2]]) {
        const box = document.createElement('div');
        const stream = new MarkdownStream(box);
        for (let at = 0, n = 1; at < doc.length; n += 1) {
          const length = 1 + Math.floor(random() * longest);
          stream.push(doc.slice(at, at + length));
          at += length;
          if (n % perFrame === 0) while (stream.render()) { /* the next frame */ }
        }
        while (stream.render({ final: true })) { /* the next frame */ }
        const got = box.innerHTML;
        const want = whole.innerHTML;
        let same = 0;
        while (same < got.length && got[same] === want[same]) same += 1;
        outcomes.push({ longest, length: doc.length, equal: got === want, got: got.slice(same - 60, same + 100), want: want.slice(same - 60, same + 100) });
      }
      return outcomes;
    });
    for (const { longest, equal, got, want } of outcomes) {
      assert.ok(equal, `chunks of up to ${longest} characters rendered differently:\n got …${got}…\nwant …${want}…`);
    }
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  it('shows crafted long lines and tag soup as text instead of holding the page', async () => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    const got = await page.evaluate(async () => {
      const { MarkdownStream, renderMarkdown } = await import('/js/markdown.js');
      const crafted = 'a_'.repeat(20_000); // 40 KB: marked 18 parses it in seconds (markedjs/marked#4099)
      let started = performance.now();
      const whole = document.createElement('div');
      whole.append(renderMarkdown(`# Title\n\n${crafted}\n`));
      const wholeMs = performance.now() - started;
      // Streamed as the page does it: one render() a frame. What holds the page is the longest
      // render() call; what the stream costs is their sum (the time between frames, where a slow
      // tail makes the next render wait, is the page's to use).
      const box = document.createElement('div');
      const stream = new MarkdownStream(box);
      let longestMs = 0;
      let busyMs = 0;
      const timed = (options) => {
        const at = performance.now();
        const more = stream.render(options);
        const ms = performance.now() - at;
        longestMs = Math.max(longestMs, ms);
        busyMs += ms;
        return more;
      };
      const frame = () => new Promise((resolve) => requestAnimationFrame(resolve));
      for (let at = 0; at < crafted.length; at += 997) {
        stream.push(crafted.slice(at, at + 997));
        while (timed()) await frame();
      }
      while (timed({ final: true })) await frame();
      // The same length inside a code fence is still a highlighted code block.
      const fenced = document.createElement('div');
      fenced.append(renderMarkdown(`\`\`\`js\nlet s = "${'x'.repeat(20_000)}";\n\`\`\`\n`));
      // A raw HTML block of 16,000 unclosed tags (the tag pattern once scanned to its end per `<`).
      started = performance.now();
      const tags = document.createElement('div');
      tags.append(renderMarkdown(`<div>\n${'<a b c\n'.repeat(16_000)}`));
      const tagsMs = performance.now() - started;
      return {
        wholeMs, longestMs, busyMs, tagsMs, tagsText: tags.textContent.includes('<a b c'),
        wholeText: whole.querySelector('.md-plain')?.textContent ?? null,
        streamText: box.textContent.replace(/\s/g, ''),
        fencedCode: !!fenced.querySelector('pre code .hljs-string'),
      };
    });
    console.log(`crafted 40 KB line: whole ${got.wholeMs.toFixed(0)} ms, streamed ${got.busyMs.toFixed(0)} ms of work, `
      + `its longest render ${got.longestMs.toFixed(0)} ms; 16,000 unclosed tags: ${got.tagsMs.toFixed(0)} ms`);
    assert.ok(got.tagsText && got.tagsMs < 2_000, `unclosed tags held the page: ${got.tagsMs} ms`);
    assert.ok(got.wholeText?.includes('a_a_a_'), 'the crafted line is shown as its text');
    assert.equal(got.streamText, 'a_'.repeat(20_000));
    assert.ok(got.wholeMs < 400 && got.longestMs < 400 && got.busyMs < 2_000, `held the page: ${JSON.stringify(got)}`);
    assert.ok(got.fencedCode, 'a long line in a code fence is still highlighted code');
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  it(`streams a ${LONG_CHUNKS}-chunk reply, and replays it, without long tasks`, async () => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    await page.getByTestId('agent-select').selectOption('plain');
    await connected(page);
    await page.getByTestId('new-session').click();
    await page.getByTestId('session-item').first().waitFor();

    await page.evaluate(watchLongTasks);
    const started = Date.now();
    await page.getByTestId('prompt-input').fill(`a long one [chunks=${LONG_CHUNKS}] [delay_us=0]`);
    await page.getByTestId('send').click();
    const last = page.getByTestId('message-agent').filter({ hasText: `chunk ${LONG_CHUNKS}/${LONG_CHUNKS}:` });
    await last.waitFor({ timeout: LONG_TURN_MS });
    const live = Date.now() - started;
    await page.getByTestId('send').waitFor();
    const lines = () => page.getByTestId('message-agent').evaluate((m) => (m.textContent.match(/chunk \d+\/\d+:/g) ?? []).length);
    assert.equal(await lines(), LONG_CHUNKS);
    const liveTasks = await page.evaluate(() => window.longTasks);
    process.stdout.write(`# live: ${LONG_CHUNKS} chunks on screen in ${live} ms; ${summary(liveTasks)}\n`);

    // Replay: session/load sends all of it at once.
    await page.reload();
    await connected(page);
    await page.evaluate(watchLongTasks);
    const reloaded = Date.now();
    await page.locator('[data-testid="session-item"] .session-open').first().click();
    await last.waitFor({ timeout: LONG_TURN_MS });
    const replay = Date.now() - reloaded;
    await waitUntil('every chunk of the replay on screen', async () => (await lines()) === LONG_CHUNKS, { ms: STEP_MS });
    const replayTasks = await page.evaluate(() => window.longTasks);
    process.stdout.write(`# replay: on screen in ${replay} ms; ${summary(replayTasks)}\n`);

    assert.ok(live < LONG_TURN_MS, `the live turn took ${live} ms`);
    for (const [what, tasks] of [['live', liveTasks], ['replay', replayTasks]]) {
      assert.ok(Math.max(0, ...tasks) < LONGEST_TASK_MS, `${what}: ${summary(tasks)}`);
    }
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});
