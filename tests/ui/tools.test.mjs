// Tool call cards in the web UI (issue 11, item 2): cards by kind and status, `diff` content as a
// unified / side-by-side diff with its path, terminal output with ANSI colours, locations as
// clickable path:line that open the file viewer (GET /api/fs/file) at the line, and the viewer's
// refusal of a path outside the workspace.
//
// Two gateways: `demo-agent --showcase` (what a new user sees: read, edit with a real diff of
// acp-demo/hello.rs, coloured `cargo test`), at desktop and phone widths; and
// tests/agents/ui_tools_agent.py for what the showcase does not send (a failed call, a terminal
// reference, a two-hunk diff, a diff over the row cap, a location outside the workspace).
//
// Run: `cargo build && cd tests/ui && node --test tools.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, REPO, shutdown, startGateway, STEP_MS } from './harness.mjs';

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** axe-core's serious and critical violations inside `selector` (the cards, the open viewer). */
async function axeViolations(page, selector) {
  await page.evaluate(AXE_SOURCE);
  return page.evaluate(async (include) => {
    // eslint-disable-next-line no-undef
    const result = await axe.run({ include: [...document.querySelectorAll(include)].map((el) => [el]) }, { resultTypes: ['violations'] });
    return result.violations.filter((v) => ['serious', 'critical'].includes(v.impact))
      .map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  }, selector);
}

/** The cards axe scans: all but the two long diffs (the same markup as t-edit, and slow to scan). */
const SCANNED_CARDS = '[data-testid="tool-call"]:not([data-tool-call-id="t-big"], [data-tool-call-id="t-rewrite"])';

const TOOLS_AGENT = `/usr/bin/python3 ${path.join(REPO, 'tests/agents/ui_tools_agent.py')}`;

const card = (page, id) => page.locator(`[data-testid="tool-call"][data-tool-call-id="${id}"]`);
const cardOfKind = (page, kind) => page.locator(`[data-testid="tool-call"][data-kind="${kind}"]`);

/** Sends `text` as the first prompt: the web UI starts a session in the user's workspace root. */
async function prompt(page, text) {
  await connected(page);
  await page.getByTestId('prompt-input').fill(text);
  await page.getByTestId('prompt-input').press('Enter');
}

/** The computed colour, as [r, g, b], of the first coloured span inside `scope` with `text`. */
async function colourOf(scope, text) {
  const css = await scope.locator('span.tc-ansi', { hasText: text }).first().evaluate((el) => getComputedStyle(el).color);
  const m = /^rgb\((\d+), (\d+), (\d+)\)$/.exec(css);
  assert.ok(m, `not an rgb() colour: ${css}`);
  return m.slice(1).map(Number);
}

/** Opens the viewer from `trigger` and waits for it to settle (ready or an error). */
async function openViewer(page, trigger) {
  await trigger.click();
  const dialog = page.getByTestId('file-viewer');
  await dialog.waitFor();
  await page.waitForFunction(() => {
    const d = document.querySelector('[data-testid="file-viewer"]');
    return d?.open && d.dataset.state && d.dataset.state !== 'loading';
  }, null, { timeout: STEP_MS });
  return dialog;
}

/** Is `el`'s box inside the viewer's scrolling body (the marked line was scrolled to)? */
async function inViewerView(page, el) {
  const body = await page.getByTestId('file-viewer-body').boundingBox();
  const box = await el.boundingBox();
  return box && body && box.y >= body.y - 1 && box.y + box.height <= body.y + body.height + 1;
}

/**
 * The page's errors, less the browser's own log lines for the viewer's refused requests (Chromium
 * logs every 4xx answer to fetch() as a console error; those answers are what the test asks for).
 */
function errorsBut(v, statuses) {
  const errors = v.errors();
  const expected = new RegExp(`status of (${statuses.join('|')}) .*/api/fs/file\\?path=`);
  errors.console = errors.console.filter((line) => !expected.test(line));
  return errors;
}

describe('tool call cards: demo-agent --showcase', () => {
  let gw;
  let browser;

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--showcase', '--delay-us', '2000'] });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  for (const [name, viewport] of [['desktop', DESKTOP], ['phone', PHONE]]) {
    it(`shows read, edit (diff) and execute (ANSI) cards and opens locations (${name})`, async () => {
      const v = await browser.open(gw, viewport);
      const { page } = v;
      try {
        await prompt(page, `show me the tools (${name})`);
        const read = cardOfKind(page, 'read').first();
        const edit = cardOfKind(page, 'edit').first();
        const exec = cardOfKind(page, 'execute').first();
        await page.locator('[data-testid="tool-call"][data-kind="execute"]:is([data-status="completed"], [data-status="failed"])').first().waitFor();
        await page.getByTestId('send').waitFor(); // the turn is over

        // Kinds and statuses, with their labels.
        assert.equal(await read.getAttribute('data-status'), 'completed');
        assert.equal(await edit.getAttribute('data-status'), 'completed');
        assert.equal(await read.getByTestId('tool-kind').textContent(), 'Read');
        assert.equal(await edit.getByTestId('tool-kind').textContent(), 'Edit');
        assert.equal(await exec.getByTestId('tool-kind').textContent(), 'Run');
        assert.equal(await read.getByTestId('tool-status').textContent(), 'Done');
        // A finished read folds away; the diff and the terminal output stay open.
        assert.equal(await read.locator('.tc-toggle').getAttribute('aria-expanded'), 'false');
        assert.equal(await edit.locator('.tc-toggle').getAttribute('aria-expanded'), 'true');
        assert.equal(await exec.locator('.tc-toggle').getAttribute('aria-expanded'), 'true');
        assert.equal(await exec.getByTestId('tool-command').textContent(), '$ cargo test');
        assert.match(await exec.getByTestId('tool-exit-code').textContent(), /^exit code \d+$/);
        assert.equal(await edit.getByTestId('tool-raw-input').count(), 0, 'the path alone needs no input details');

        // The diff: the path relative to the cwd, added and removed lines, the real file's text.
        const diff = edit.getByTestId('tool-diff');
        assert.equal(await diff.getByTestId('diff-path').textContent(), 'acp-demo/hello.rs');
        const written = readFileSync(path.join(gw.workspaceRoot('local'), 'acp-demo/hello.rs'), 'utf8');
        const added = diff.locator('[data-testid="diff-line"][data-type="add"]');
        assert.ok(await added.count() >= 1, 'no added lines');
        const addedText = (await added.locator('.tc-code').allTextContents()).join('\n');
        for (const line of addedText.split('\n')) assert.ok(written.includes(line), `added line not in the file: ${line}`);
        if ((await diff.getAttribute('data-new-file')) === 'false') {
          assert.ok(await diff.locator('[data-testid="diff-line"][data-type="del"]').count() >= 1, 'no removed lines');
        }
        const addBg = await added.first().locator('.tc-code').evaluate((el) => getComputedStyle(el).backgroundColor);
        assert.notEqual(addBg, 'rgba(0, 0, 0, 0)', 'added lines are not coloured');

        // Terminal output: coloured spans, colours from the CSSOM, no escape characters left.
        const terminal = exec.getByTestId('terminal').last();
        const text = await terminal.textContent();
        assert.ok(!text.includes('\u001b'), 'raw escape sequences in the terminal text');
        const coloured = await terminal.evaluate((pre) => {
          const base = getComputedStyle(pre).color;
          return [...pre.querySelectorAll('span.tc-ansi')].map((s) => getComputedStyle(s).color).filter((c) => c !== base);
        });
        assert.ok(coloured.length >= 2, `too few coloured spans: ${coloured}`);
        assert.ok(coloured.some((c) => /^rgb\(\d+, \d+, \d+\)$/.test(c)));

        await edit.scrollIntoViewIfNeeded();
        await v.shot(`tools-${name}`);

        // A location opens the viewer at its line, marked and scrolled to.
        const location = read.getByTestId('tool-location');
        const label = await location.textContent();
        const line = Number(await location.getAttribute('data-line'));
        assert.match(label, /^acp-demo\/hello\.rs:\d+$/);
        const dialog = await openViewer(page, location);
        assert.equal(await dialog.getAttribute('data-state'), 'ready');
        assert.equal(await page.getByTestId('file-viewer-title').textContent(), label);
        const marked = page.getByTestId('file-viewer-line');
        assert.equal(Number(await marked.getAttribute('data-n')), line);
        assert.equal(await marked.getAttribute('aria-current'), 'true');
        assert.equal((await marked.locator('.tc-vcode').textContent()), written.split('\n')[line - 1]);
        assert.ok(await inViewerView(page, marked), 'the marked line is not scrolled into view');
        assert.ok(await dialog.locator('[class^="hljs-"]').count() > 0, 'no syntax highlighting');
        await v.shot(`tools-viewer-${name}`);
        await page.keyboard.press('Escape');
        await dialog.waitFor({ state: 'hidden' });
        assert.ok(await location.evaluate((el) => el === document.activeElement), 'focus did not return to the location');

        // The diff header opens the file too, at the first change.
        const firstChange = Number(await diff.getByTestId('diff-path').getAttribute('data-line'));
        assert.ok(firstChange >= 1);
        await openViewer(page, diff.getByTestId('diff-path'));
        assert.equal(await page.getByTestId('file-viewer-title').textContent(), `acp-demo/hello.rs:${firstChange}`);
        assert.equal(Number(await page.getByTestId('file-viewer-line').getAttribute('data-n')), firstChange);
        await page.getByTestId('file-viewer-close').click();

        // A path outside the workspace: the gateway refuses, the viewer says so.
        await page.evaluate(async () => {
          const { openFileViewer } = await import('/js/file-viewer.js');
          openFileViewer('/etc/hostname', 1, {});
        });
        await page.getByTestId('file-viewer-error').waitFor();
        assert.equal(await page.getByTestId('file-viewer-error').getAttribute('data-status'), '403');
        assert.match(await page.getByTestId('file-viewer-error').textContent(), /outside your workspace/);
        await page.keyboard.press('Escape');

        assert.deepEqual(errorsBut(v, [403]), NO_ERRORS);
      } finally {
        await v.close();
      }
    });
  }

  // A long build log streamed the claude-code-acp way (`_meta.terminal_output`): 2,000 updates of
  // 1 KB, each rendered before the next, drive a ToolCard in the page. The card keeps the last
  // TERMINAL_CHAR_CAP characters, and an update costs the same at the end as at the start (it
  // used to stringify and re-parse the whole kept text: 200 KB per update once the log was long).
  it('keeps a long terminal output bounded, and each update as fast at the end as at the start', async () => {
    const v = await browser.open(gw, DESKTOP);
    try {
      await connected(v.page);
      const figures = await v.page.evaluate(async () => {
        const { ToolCard } = await import('/js/tools.js');
        const { renderTerminal, TERMINAL_CHAR_CAP } = await import('/js/terminal.js');
        const card = new ToolCard('long-log');
        document.querySelector('[role="log"]').append(card.root);
        card.apply({ sessionUpdate: 'tool_call', toolCallId: 'long-log', kind: 'execute', status: 'in_progress', title: 'cargo build', rawInput: { command: 'cargo build' } });
        const E = '\u001b';
        // 1 KB per update; a colour left open at the end of each one carries into the next.
        const chunk = (n) => {
          let text = `${E}[0m`;
          for (let i = 0; text.length < 900; i += 1) text += `   ${E}[1;32mCompiling${E}[0m crate-${n}-${i} v0.1.0\n`;
          return `${text}${E}[33mwarn`.padEnd(1024, ' ');
        };
        const times = [];
        for (let n = 0; n < 2000; n += 1) {
          const data = chunk(n);
          const t0 = performance.now();
          card.apply({ sessionUpdate: 'tool_call_update', toolCallId: 'long-log', _meta: { terminal_output: { terminal_id: 'x', data } } });
          await Promise.resolve(); // the card renders in a microtask
          times.push(performance.now() - t0);
        }
        const pre = card.root.querySelector('[data-testid="terminal"]');
        // What was appended draws what a render of the kept text from scratch draws (the blocks
        // appended output goes into aside).
        const runs = (root) => {
          const out = [];
          const walk = (node, style) => {
            for (const child of node.childNodes) {
              if (child.nodeType === Node.TEXT_NODE) {
                const last = out[out.length - 1];
                if (last && last.style === style) last.text += child.data;
                else out.push({ style, text: child.data });
              } else walk(child, child.classList.contains('tc-term-part') ? style : `${child.className}|${child.style.cssText}`);
            }
          };
          walk(root, '');
          return out;
        };
        const fresh = renderTerminal(card.terminalOut, { clipped: card.terminalClipped });
        // Output that must not simply be appended: an escape sequence cut in two, a carriage
        // return redrawing a line across updates, an OSC link, a Markdown fence.
        const tricky = new ToolCard('tricky');
        document.querySelector('[role="log"]').append(tricky.root);
        tricky.apply({ sessionUpdate: 'tool_call', toolCallId: 'tricky', kind: 'execute', status: 'in_progress' });
        const pieces = ['ok ', `${E}[3`, `1mred`, ` still red${E}[0m\n`, 'progress 10%\r', 'progress 100%\n',
          `${E}]8;;https://example.com${E}\\`, `link${E}]8;;${E}\\ done\n`, '```\n', 'fenced\n```\n'];
        const trickyRuns = [];
        for (const data of pieces) {
          tricky.apply({ sessionUpdate: 'tool_call_update', toolCallId: 'tricky', _meta: { terminal_output: { terminal_id: 't', data } } });
          await Promise.resolve();
          const shown = tricky.root.querySelector('[data-testid="terminal"]');
          trickyRuns.push(JSON.stringify(runs(shown)) === JSON.stringify(runs(renderTerminal(tricky.terminalOut))) ? 'same' : shown.textContent);
        }
        const window = (from) => {
          const sorted = times.slice(from, from + 200).sort((a, b) => a - b);
          return { median: sorted[100], p95: sorted[190], max: sorted[199] };
        };
        return {
          cap: TERMINAL_CHAR_CAP,
          kept: card.terminalOut.length,
          clipped: card.terminalClipped,
          shown: pre.textContent.length,
          sameAsFresh: JSON.stringify(runs(pre)) === JSON.stringify(runs(fresh)),
          trickyRuns,
          endsWithLast: pre.textContent.endsWith(chunk(1999).replace(/\u001b\[[0-9;]*m/g, '')),
          note: pre.querySelector('.tc-clipped')?.textContent,
          first: window(0), last: window(1800),
          total: times.reduce((a, b) => a + b, 0),
        };
      });
      const ms = (w) => `median ${w.median.toFixed(2)} ms, p95 ${w.p95.toFixed(2)} ms, max ${w.max.toFixed(2)} ms`;
      console.log(`terminal: 2,000 updates of 1 KB in ${figures.total.toFixed(0)} ms; kept ${figures.kept.toLocaleString()} characters `
        + `(${figures.clipped.toLocaleString()} clipped), block ${figures.shown.toLocaleString()} characters; `
        + `updates 1-200: ${ms(figures.first)}; updates 1801-2000: ${ms(figures.last)}`);
      assert.ok(figures.kept <= figures.cap, `kept ${figures.kept} characters`);
      assert.equal(figures.kept + figures.clipped, 2000 * 1024);
      assert.ok(figures.shown < figures.cap + 100, `the block holds ${figures.shown} characters`);
      assert.equal(figures.note, `… ${figures.clipped.toLocaleString('en-US')} earlier characters not shown\n`);
      assert.ok(figures.endsWithLast, 'the last output is not at the end of the block');
      assert.ok(figures.sameAsFresh, 'appended output draws differently from a fresh render');
      assert.deepEqual(figures.trickyRuns, Array(figures.trickyRuns.length).fill('same'));
      // Flat: the end of a 2 MB log costs what its start did (a rebuild each 100 KB aside).
      assert.ok(figures.last.median < Math.max(2, 3 * figures.first.median), `per-update time grew: ${ms(figures.first)} → ${ms(figures.last)}`);
      assert.deepEqual(v.errors(), NO_ERRORS);
    } finally {
      await v.close();
    }
  });
});

describe('tool call cards: edge cases (tests/agents/ui_tools_agent.py)', () => {
  let gw;
  let browser;
  let v;

  before(async () => {
    gw = await startGateway({ agent: TOOLS_AGENT });
    browser = await openBrowser();
    v = await browser.open(gw, DESKTOP);
    await prompt(v.page, 'tools please');
    await card(v.page, 't-outside').waitFor();
    await v.page.getByTestId('send').waitFor();
  });

  after(() => shutdown(browser, gw));

  it('merges updates: kinds, statuses, titles as text, folding', async () => {
    const { page } = v;
    const expect = { 't-read': ['read', 'completed'], 't-edit': ['edit', 'completed'], 't-big': ['edit', 'completed'], 't-rewrite': ['edit', 'completed'],
      't-exec': ['execute', 'failed'], 't-fetch': ['fetch', 'failed'], 't-term': ['execute', 'in_progress'], 't-meta': ['execute', 'completed'], 't-outside': ['search', 'completed'] };
    assert.equal(await page.getByTestId('tool-call').count(), Object.keys(expect).length);
    for (const [id, [kind, status]] of Object.entries(expect)) {
      assert.equal(await card(page, id).getAttribute('data-kind'), kind, id);
      assert.equal(await card(page, id).getAttribute('data-status'), status, id);
    }
    // The title is text, never markup.
    const fetch = card(page, 't-fetch');
    assert.equal(await fetch.getByTestId('tool-title').textContent(), '<img src=x onerror=alert(1)> fetch');
    assert.equal(await fetch.locator('img').count(), 0);
    // Failed stays open (with its input in a details); the running one spins.
    assert.equal(await fetch.locator('.tc-toggle').getAttribute('aria-expanded'), 'true');
    assert.match(await fetch.getByTestId('tool-raw-input').textContent(), /example\.invalid/);
    assert.equal(await card(page, 't-term').locator('.tc-spinner').count(), 1);
    assert.match(await card(page, 't-term').getByTestId('tool-terminal-ref').textContent(), /does not host agent terminals/);
    // A completed read folds; a click unfolds it and it stays the user's choice.
    const read = card(page, 't-read');
    const toggle = read.locator('.tc-toggle');
    assert.equal(await toggle.getAttribute('aria-expanded'), 'false');
    assert.equal(await read.getByTestId('tool-text').isVisible(), false);
    await toggle.click();
    assert.equal(await toggle.getAttribute('aria-expanded'), 'true');
    assert.match(await read.getByTestId('tool-text').textContent(), /fixture the tool-call test opens/);
    // A read of a Rust file is a Rust code block (the messages' renderer, with its Copy button).
    assert.equal(await read.getByTestId('tool-text').locator('[data-testid="code-block"]').getAttribute('data-lang'), 'rust');
    assert.ok(await read.getByTestId('tool-text').locator('[class^="hljs-"]').count() > 0);
    await toggle.press('Enter');
    assert.equal(await toggle.getAttribute('aria-expanded'), 'false');
    // Other tool output is Markdown, like the messages.
    const search = card(page, 't-outside');
    await search.locator('.tc-toggle').click();
    assert.equal(await search.getByTestId('tool-text').locator('strong').textContent(), '1');
    assert.match(await search.getByTestId('tool-text').locator('[data-testid="code-block"] code').textContent(), /^\/etc\/hostname:1: localhost/);
    await search.locator('.tc-toggle').click();
  });

  it('renders a two-hunk diff with line numbers, a capped new file, and the side-by-side view', async () => {
    const { page } = v;
    const diff = card(page, 't-edit').getByTestId('tool-diff');
    assert.equal(await diff.getByTestId('diff-path').textContent(), 'tools-fixture/lib.rs');
    assert.equal(await diff.locator('.tc-hunk').count(), 2);
    assert.equal(await diff.locator('[data-type="add"]').count(), 3);
    assert.equal(await diff.locator('[data-type="del"]').count(), 2);
    const firstAdd = diff.locator('[data-type="add"]').first();
    assert.equal(await firstAdd.locator('.tc-code').textContent(), '// line 5: fixture for the diff viewer');
    // Within a changed line, the word that changed is marked on both sides; a rewritten line is not.
    assert.deepEqual(await firstAdd.locator('.tc-word').allTextContents(), ['diff']);
    assert.deepEqual(await diff.locator('[data-type="del"]').first().locator('.tc-word').allTextContents(), ['file']);
    assert.equal(await diff.locator('[data-type="add"]', { hasText: 'changed near the end' }).locator('.tc-word').count(), 0);
    assert.equal(await firstAdd.locator('.tc-ln').nth(1).getAttribute('data-n'), '5');
    assert.equal(await diff.locator('.tc-stat-add').textContent(), '+3');
    assert.ok(await diff.locator('[class^="hljs-"]').count() > 0, 'no syntax highlighting in the diff');

    assert.equal(await diff.getByTestId('diff-path').getAttribute('data-line'), '5', 'the path opens at the first change');

    const big = card(page, 't-big').getByTestId('tool-diff');
    assert.equal(await big.getAttribute('data-new-file'), 'true');
    assert.match(await big.textContent(), /new file/);
    assert.equal(await big.locator('[data-testid="diff-line"]').count(), 2000);
    await big.getByTestId('diff-show-all').click();
    assert.equal(await big.locator('[data-testid="diff-line"]').count(), 2500);
    assert.equal(await big.getByTestId('diff-show-all').count(), 0);

    // Every line of 2,500 rewritten: jsdiff needs longer than the page allows (100 ms; a rewrite
    // of 1,000 lines sometimes made it on a quick machine), so the worker answers.
    const rewrite = card(page, 't-rewrite').getByTestId('tool-diff');
    await rewrite.and(page.locator('[data-state="ready"]')).waitFor();
    assert.equal(await rewrite.getAttribute('data-computed-by'), 'worker');
    assert.equal(await diff.getAttribute('data-computed-by'), 'page');
    assert.equal(await rewrite.locator('.tc-stat-add').textContent(), '+2500');
    assert.equal(await rewrite.locator('.tc-stat-del').textContent(), '−2500');
    assert.equal(await rewrite.locator('.tc-diff-note').count(), 0, 'the exact diff was not computed');
    assert.equal(await rewrite.locator('[data-testid="diff-line"]').count(), 2000);

    await diff.getByTestId('diff-view-toggle').click();
    assert.equal(await diff.getAttribute('data-view'), 'split');
    // A changed line pairs its old and new text on one row.
    const change = diff.locator('[data-type="change"]').first();
    assert.deepEqual(await change.locator('.tc-code').allTextContents(), ['// line 5: fixture for the file viewer', '// line 5: fixture for the diff viewer']);
    await card(page, 't-edit').scrollIntoViewIfNeeded();
    await v.shot('tools-split-desktop');
    await diff.getByTestId('diff-view-toggle').click();
    assert.equal(await diff.getAttribute('data-view'), 'unified');
  });

  it('colours terminal output through the CSSOM and drops control sequences', async () => {
    const { page } = v;
    const exec = card(page, 't-exec');
    assert.equal(await exec.getByTestId('tool-command').textContent(), '$ cargo test --color=always');
    assert.equal(await exec.getByTestId('tool-raw-input').count(), 0, 'the command alone needs no input details');
    const term = exec.getByTestId('terminal');
    // ANSI colours keep their hue; dark red is lifted to read on the dark terminal (4.5:1).
    const [r, g, b] = await colourOf(term, 'FAILED');
    assert.ok(r > 180 && r > g + 60 && r > b + 60, `FAILED is not red: ${[r, g, b]}`);
    assert.deepEqual(await colourOf(term, 'ok'), [0, 187, 0]);
    assert.deepEqual(await colourOf(term, 'truecolor'), [255, 128, 0]);
    assert.equal(await term.locator('span.tc-ansi', { hasText: 'Compiling' }).evaluate((el) => getComputedStyle(el).fontWeight), '700');
    assert.match(await term.locator('span.tc-ansi', { hasText: 'underlined' }).evaluate((el) => getComputedStyle(el).textDecorationLine), /underline/);
    const text = await term.textContent();
    assert.ok(!/[\u001b\r]/.test(text), 'control characters left in the terminal');
    assert.match(text, /progress 100%/);
    assert.doesNotMatch(text, /progress 10%/);
    assert.doesNotMatch(text, /\]8;;/);
    // Output sent the claude-code-acp way, in `_meta.terminal_output`, accumulates; the exit code shows.
    const meta = card(page, 't-meta');
    assert.equal(await meta.getByTestId('terminal').textContent(), 'warning: unused\n    Finished dev\n');
    assert.ok((await colourOf(meta.getByTestId('terminal'), 'warning'))[0] > 150, 'yellow lost');
    assert.equal(await meta.getByTestId('tool-terminal-ref').count(), 0);
    assert.match(await meta.textContent(), /exit code 0/);

    // No style="" strings: every colour came through the CSSOM (the CSP would block the others).
    assert.deepEqual(v.errors().csp, []);
  });

  it('opens a location at its line, and refuses one outside the workspace', async () => {
    const { page } = v;
    const location = card(page, 't-read').getByTestId('tool-location');
    assert.equal(await location.textContent(), 'tools-fixture/lib.rs:40');
    await openViewer(page, location);
    const marked = page.getByTestId('file-viewer-line');
    assert.equal(await marked.getAttribute('data-n'), '40');
    assert.match(await marked.textContent(), /pub fn answer\(\) -> u32 \{ 42 \}/);
    assert.ok(await inViewerView(page, marked), 'line 40 is not scrolled into view');
    assert.match(await page.getByTestId('file-viewer-meta').textContent(), /^121 lines/);
    await page.keyboard.press('Escape');
    await page.getByTestId('file-viewer').waitFor({ state: 'hidden' });

    const outside = card(page, 't-outside').getByTestId('tool-location');
    assert.equal(await outside.textContent(), '/etc/hostname:1');
    await openViewer(page, outside);
    const error = page.getByTestId('file-viewer-error');
    assert.equal(await error.getAttribute('data-status'), '403');
    assert.equal(await error.textContent(),
      `This file is outside your workspace (${gw.workspaceRoot('local')}), so the gateway will not show it.`);
    await v.shot('tools-refused-desktop');
    await page.getByTestId('file-viewer-close').click();

    // A file that is not there: 404, said plainly.
    await page.evaluate(async (root) => {
      const { openFileViewer } = await import('/js/file-viewer.js');
      openFileViewer(`${root}/tools-fixture/missing.rs`, 3, { cwd: root });
    }, gw.workspaceRoot('local'));
    await page.getByTestId('file-viewer-error').waitFor();
    assert.equal(await page.getByTestId('file-viewer-error').getAttribute('data-status'), '404');
    assert.equal(await page.getByTestId('file-viewer-error').textContent(), 'This file does not exist (any more).');
    await page.keyboard.press('Escape');

    // A directory is not a file: the gateway's own words.
    await page.evaluate(async (root) => {
      const { openFileViewer } = await import('/js/file-viewer.js');
      openFileViewer(`${root}/tools-fixture`, null, { cwd: root });
    }, gw.workspaceRoot('local'));
    await page.getByTestId('file-viewer-error').waitFor();
    assert.equal(await page.getByTestId('file-viewer-error').textContent(), 'The gateway answered 400: not a regular file.');
    await page.keyboard.press('Escape');
  });

  it('passes an axe-core scan of the cards and of the open viewer', async () => {
    const { page } = v;
    await card(page, 't-edit').getByTestId('diff-view-toggle').click(); // the side-by-side table too
    assert.deepEqual(await axeViolations(page, SCANNED_CARDS), []);
    await card(page, 't-edit').getByTestId('diff-view-toggle').click();
    await openViewer(page, card(page, 't-read').getByTestId('tool-location'));
    assert.deepEqual(await axeViolations(page, '[data-testid="file-viewer"]'), []);
    await page.keyboard.press('Escape');
  });

  it('in dark mode with reduced motion, replayed from the server: the same cards, still, and axe passes', async () => {
    const dark = await browser.open(gw, { ...DESKTOP, colorScheme: 'dark', reducedMotion: 'reduce' });
    try {
      const { page } = dark;
      await connected(page);
      await page.getByTestId('session-item').first().locator('.session-open').click();
      await card(page, 't-outside').waitFor();
      assert.equal(await page.getByTestId('tool-call').count(), 9);
      assert.equal(await card(page, 't-exec').getAttribute('data-status'), 'failed');
      // prefers-reduced-motion: the running card's spinner stands still.
      assert.equal(await card(page, 't-term').locator('.tc-spinner').evaluate((el) => getComputedStyle(el).animationName), 'none');
      assert.equal(await card(v.page, 't-term').locator('.tc-spinner').evaluate((el) => getComputedStyle(el).animationName), 'tc-spin');
      assert.deepEqual(await axeViolations(page, SCANNED_CARDS), []);
      await card(page, 't-exec').scrollIntoViewIfNeeded();
      await dark.shot('tools-dark-desktop');
      assert.deepEqual(dark.errors(), NO_ERRORS);
    } finally {
      await dark.close();
    }
  });

  it('raised no page errors, console errors or CSP violations', () => {
    assert.deepEqual(errorsBut(v, [400, 403, 404]), NO_ERRORS);
  });
});
