// Session controls in the web UI (issue 11, item 3).
//
// Against `demo-agent --showcase`: the cwd picker over /api/fs/dirs (browse by keyboard, make a
// folder, choose it: the new session runs there), the agent's modes and config options (the reply
// says which mode and model answered; a refused change is reverted and shown), usage per turn and
// per session, all of it back after switching sessions and after a reload; desktop and phone
// (screenshots controls-desktop.png, controls-phone.png, controls-picker-desktop.png), and its
// slash commands, announced right after the session/new answer.
//
// Against tests/agents/controls_agent.py: two workspace roots, grouped and boolean options, slash
// completion by keyboard and mouse with the input hint, PromptResponse `usage` tokens, an agent
// that switches its own mode, per-session state, a second tab that follows; axe-core on the open
// picker and command list (screenshots controls-slash-desktop.png, controls-slash-phone.png).
//
// Run: `cargo build && cd tests/ui && node --test controls.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, REPO, shutdown, startGateway, STEP_MS, waitUntil } from './harness.mjs';

const byId = (page, id) => page.getByTestId(id);

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** axe-core's serious and critical violations on the page as it is ("rule: targets"). */
async function axeBlocking(page) {
  await page.evaluate(AXE_SOURCE);
  return page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const result = await axe.run(document, { resultTypes: ['violations'] });
    return result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
  });
}

/** The caller's sessions, as GET /api/sessions answers them (with the page's cookie). */
async function sessions(page, base) {
  const res = await page.context().request.get(`${base}/api/sessions`);
  assert.equal(res.status(), 200);
  return (await res.json()).sessions;
}

/** Waits for the turn in flight to end (Send is back). */
const turnDone = (page) => byId(page, 'send').waitFor({ state: 'visible', timeout: STEP_MS * 2 });

/** Options of a select, as [value, label] pairs. */
const optionsOf = (select) => select.evaluate((s) => [...s.options].map((o) => [o.value, o.textContent]));

/** Sends `text` with Enter in the prompt box and waits for the turn to end. */
async function send(page, text) {
  const input = byId(page, 'prompt-input');
  await input.fill(text);
  await input.press('Enter');
  await byId(page, 'stop').waitFor({ state: 'visible' }).catch(() => {}); // may be over already
  await turnDone(page);
}

/** The visible text of the conversation's last agent message. */
const lastAgentText = (page) => page.locator('[data-testid="message-agent"]').last().innerText();

/**
 * Types "/" in the empty prompt box: the names the completion list offers (null when it does not
 * open within `ms`); the list is closed again and the box emptied unless `keepOpen`.
 */
async function slashOffered(page, { ms = 3_000, keepOpen = false } = {}) {
  const input = byId(page, 'prompt-input');
  const list = byId(page, 'slash-list');
  let names = null;
  const deadline = Date.now() + ms;
  while (!names && Date.now() < deadline) {
    await input.fill('');
    await input.focus();
    await page.keyboard.type('/');
    names = await list.waitFor({ timeout: 500 }).then(
      () => byId(page, 'slash-option').evaluateAll((els) => els.map((e) => e.dataset.name)), () => null);
  }
  if (!keepOpen) {
    await page.keyboard.press('Escape');
    await input.fill('');
  }
  return names;
}

/** Opens the sidebar on a phone (a drawer), no-op on a desktop. */
async function showSidebar(page) {
  const toggle = byId(page, 'sidebar-toggle');
  if (await toggle.isVisible() && !(await byId(page, 'cwd-browse').isVisible())) await toggle.click();
  await byId(page, 'cwd-browse').waitFor({ state: 'visible' });
}

describe('session controls: demo-agent --showcase', () => {
  let gw;
  let browser;
  let root;

  before(async () => {
    gw = await startGateway({ agent: ['demo-agent', '--showcase', '--delay-us', '2000', '--chunks', '8'] });
    browser = await openBrowser();
    root = gw.workspaceRoot('local');
  });

  after(() => shutdown(browser, gw));

  it('desktop: cwd picker, modes, model, slash commands, usage, reload and switching', async (t) => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);
    assert.equal(await byId(page, 'cwd-input').inputValue(), root, 'the cwd field starts at the workspace root');

    // --- cwd picker: open it from the keyboard, make a folder, go up, come back by arrows ---
    await byId(page, 'cwd-browse').focus();
    await page.keyboard.press('Enter');
    const dialog = byId(page, 'cwd-dialog');
    await dialog.waitFor();
    await waitUntil('the root listed', async () => (await byId(page, 'cwd-chosen').innerText()).includes(root), { ms: STEP_MS });
    assert.match(await byId(page, 'cwd-note').innerText(), /No folders here/);
    assert.equal(await byId(page, 'cwd-up').count(), 0, 'no way up from a workspace root');
    await byId(page, 'cwd-new-folder').click();
    await page.keyboard.type('alpha');
    await page.keyboard.press('Enter');
    const alpha = path.join(root, 'alpha');
    await waitUntil('the new folder opened', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(alpha), { ms: STEP_MS });
    assert.ok(existsSync(alpha), 'POST /api/fs/dirs made the folder');
    assert.match(await byId(page, 'cwd-note').innerText(), /Created “alpha”/);
    // Breadcrumbs: the root (a button) then "alpha" (the current one).
    assert.equal(await byId(page, 'cwd-crumb').count(), 1);
    // A second folder beside it, then pick "beta" by keyboard from the root's list.
    await byId(page, 'cwd-up').focus();
    await page.keyboard.press('Enter');
    await waitUntil('back at the root', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(root), { ms: STEP_MS });
    await byId(page, 'cwd-new-folder').click();
    await byId(page, 'cwd-new-name').fill('beta');
    await byId(page, 'cwd-create').click();
    const beta = path.join(root, 'beta');
    await waitUntil('beta opened', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(beta), { ms: STEP_MS });
    await byId(page, 'cwd-entries').locator('button').first().focus();
    await page.keyboard.press('Backspace'); // up a level
    await waitUntil('the root again', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(root), { ms: STEP_MS });
    const names = (await byId(page, 'cwd-entry').evaluateAll((els) => els.map((e) => e.dataset.path)));
    assert.deepEqual(names, [alpha, beta]);
    // Focus is on the first folder (alpha); ArrowDown to beta, Enter opens it.
    await page.keyboard.press('ArrowDown');
    assert.equal(await page.evaluate(() => document.activeElement?.dataset.path), beta);
    await page.keyboard.press('Enter');
    await waitUntil('beta opened by keyboard', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(beta), { ms: STEP_MS });
    await v.shot('controls-picker-desktop');
    assert.deepEqual(await axeBlocking(page), [], 'axe on the open folder picker');
    await byId(page, 'cwd-use').click();
    await dialog.waitFor({ state: 'hidden' });
    assert.equal(await byId(page, 'cwd-input').inputValue(), beta);

    // --- the new session runs in the chosen folder ---
    await byId(page, 'new-session').click();
    await byId(page, 'session-cwd').waitFor();
    assert.match(await byId(page, 'session-cwd').innerText(), new RegExp(`${beta.replace(/[/.]/g, '\\$&')}$`));
    const listed = await sessions(page, gw.base);
    assert.equal(listed.length, 1);
    assert.equal(listed[0].cwd, beta, 'session/new got the chosen cwd');
    const first = listed[0].sessionId;

    // --- modes and config options from the session/new answer ---
    const mode = byId(page, 'mode-select');
    await mode.waitFor();
    assert.deepEqual(await optionsOf(mode), [['ask', 'Ask'], ['code', 'Code'], ['plan', 'Plan']]);
    assert.equal(await mode.inputValue(), 'code');
    const configs = byId(page, 'config-select');
    assert.equal(await configs.count(), 2);
    const model = configs.first();
    assert.equal(await model.getAttribute('data-config-id'), 'model', 'the model select comes first');
    assert.equal(await page.locator('[data-key="config:model"] .control-name').innerText(), 'Model');
    assert.equal(await model.inputValue(), 'demo-swift');
    assert.deepEqual(await optionsOf(model), [['demo-swift', 'Demo Swift'], ['demo-deep', 'Demo Deep']]);
    assert.equal(await configs.nth(1).getAttribute('data-config-id'), 'effort');

    // --- slash commands (available_commands_update, sent right after the session/new answer):
    // the scripted agent's test below covers completion fully; here the showcase's four. "/pl"
    // matches plan by prefix and explain inside the word: the prefix match is the one selected.
    const input = byId(page, 'prompt-input');
    const list = byId(page, 'slash-list');
    assert.deepEqual(await slashOffered(page), ['explain', 'diff', 'test', 'plan']);
    await input.fill('');
    await input.focus();
    await page.keyboard.type('/pl');
    await list.waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await input.inputValue(), '/plan ');
    assert.equal(await byId(page, 'slash-hint').innerText(), '/plan what to plan');
    await input.fill('');

    // --- switch mode and model, then a turn: the reply says which answered; usage shown ---
    await mode.selectOption('plan');
    await model.selectOption('demo-deep');
    await waitUntil('the mode and model applied', async () => await mode.inputValue() === 'plan' && await model.inputValue() === 'demo-deep', { ms: STEP_MS });
    assert.equal(await byId(page, 'control-error').isVisible(), false);
    await send(page, '/explain the greeting');
    assert.match(await lastAgentText(page), /Demo Deep answered, with medium reasoning effort in Plan mode/);
    const turnLine = byId(page, 'turn-usage');
    await turnLine.first().waitFor();
    assert.equal(await turnLine.count(), 1);
    const line1 = await turnLine.first().innerText();
    assert.match(line1, /^This turn: context \+[\d.,]+K? tokens \([\d.,]+K? of 200K\) · cost \$0\.\d+$/, line1);
    const usage = byId(page, 'session-usage');
    await usage.waitFor();
    const cost1 = await byId(page, 'usage-cost').innerText();
    assert.match(cost1, /^\$0\.\d+$/);
    assert.match(await byId(page, 'usage-context').innerText(), /^[\d.,]+K? \/ 200K$/);
    assert.ok(line1.endsWith(cost1), 'the first turn cost the whole session cost so far');

    // --- a second turn with the swift model: its own usage line, the session cost grows ---
    await model.selectOption('demo-swift');
    await waitUntil('swift back', async () => await model.inputValue() === 'demo-swift', { ms: STEP_MS });
    await send(page, 'hello again');
    await waitUntil('a second usage line', async () => await turnLine.count() === 2, { ms: STEP_MS });
    const line2 = await turnLine.nth(1).innerText();
    const cost2 = await byId(page, 'usage-cost').innerText();
    assert.ok(Number(cost2.slice(1)) > Number(cost1.slice(1)), `${cost2} > ${cost1}`);
    assert.notEqual(line2, line1);
    assert.match(await lastAgentText(page), /Demo Swift answered, with medium reasoning effort in Plan mode/);

    // --- a refused change is reverted and shown (a value the agent does not offer) ---
    await model.evaluate((s) => s.append(new Option('Bogus', 'bogus')));
    await model.selectOption('bogus');
    await byId(page, 'control-error').waitFor();
    assert.match(await byId(page, 'control-error').innerText(), /Could not change the model: .*unknown value/);
    await waitUntil('the model reverted', async () => await model.inputValue() === 'demo-swift', { ms: STEP_MS });
    assert.deepEqual((await optionsOf(model)).map(([value]) => value), ['demo-swift', 'demo-deep']);

    // --- a second session has its own controls; the first one's come back on switching ---
    await byId(page, 'cwd-input').fill(alpha);
    await byId(page, 'new-session').click();
    await waitUntil('the second session', async () => (await sessions(page, gw.base)).length === 2, { ms: STEP_MS });
    await waitUntil('fresh controls', async () => await mode.inputValue() === 'code' && await model.inputValue() === 'demo-swift', { ms: STEP_MS });
    assert.equal(await usage.isVisible(), false, 'no usage yet in the new session');
    assert.match(await byId(page, 'session-cwd').innerText(), /alpha$/);
    await page.locator(`[data-testid="session-item"][data-session-id="${first}"] .session-open`).click();
    await waitUntil('the first session shown', async () => (await byId(page, 'session-cwd').innerText()).endsWith('beta'), { ms: STEP_MS });
    assert.equal(await mode.inputValue(), 'plan');
    assert.equal(await usage.isVisible(), true);
    assert.equal(await byId(page, 'usage-cost').innerText(), cost2);
    await waitUntil('both usage lines replayed', async () => await turnLine.count() === 2, { ms: STEP_MS });

    // --- after a reload: everything from session/load and the replayed updates ---
    await page.reload();
    await connected(page);
    await page.locator(`[data-testid="session-item"][data-session-id="${first}"] .session-open`).click();
    await waitUntil('the first session after reload', async () => (await byId(page, 'session-cwd').innerText()).endsWith('beta'), { ms: STEP_MS });
    await waitUntil('controls restored', async () => await mode.inputValue() === 'plan' && await model.inputValue() === 'demo-swift', { ms: STEP_MS });
    await waitUntil('usage restored', async () => await usage.isVisible() && await byId(page, 'usage-cost').innerText() === cost2, { ms: STEP_MS });
    await waitUntil('turn lines restored', async () => await turnLine.count() === 2, { ms: STEP_MS });
    assert.deepEqual(await turnLine.allInnerTexts(), [line1, line2], 'the same per-turn lines as live');
    assert.deepEqual(await slashOffered(page), ['explain', 'diff', 'test', 'plan'], 'the commands are back after a reload');

    await v.shot('controls-desktop');
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });

  it('phone: picker in the drawer, controls in the composer, usage in the header', async () => {
    const v = await browser.open(gw, PHONE);
    const { page } = v;
    await connected(page);
    await showSidebar(page);
    await byId(page, 'cwd-browse').click();
    const dialog = byId(page, 'cwd-dialog');
    await dialog.waitFor();
    await waitUntil('the root listed', async () => await byId(page, 'cwd-entry').count() === 2, { ms: STEP_MS });
    const box = await dialog.boundingBox();
    assert.ok(box.x >= 0 && box.x + box.width <= 390, `the dialog fits the phone: ${JSON.stringify(box)}`);
    await byId(page, 'cwd-entry').first().click();
    await waitUntil('alpha opened', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith('alpha'), { ms: STEP_MS });
    await byId(page, 'cwd-use').click();
    await dialog.waitFor({ state: 'hidden' });
    await byId(page, 'new-session').click();
    await byId(page, 'mode-select').waitFor();
    assert.match(await byId(page, 'session-cwd').innerText(), /alpha$/);
    await byId(page, 'mode-select').selectOption('plan');
    await send(page, 'hello from a phone');
    await byId(page, 'turn-usage').waitFor();
    await byId(page, 'usage-cost').waitFor();
    for (const id of ['mode-select', 'session-usage', 'prompt-input', 'send']) {
      const b = await byId(page, id).boundingBox();
      assert.ok(b && b.x >= 0 && b.x + b.width <= 390 + 0.5, `${id} fits the phone: ${JSON.stringify(b)}`);
    }
    assert.deepEqual(await slashOffered(page, { keepOpen: true }), ['explain', 'diff', 'test', 'plan']);
    const listBox = await byId(page, 'slash-list').boundingBox();
    assert.ok(listBox.x >= 0 && listBox.x + listBox.width <= 390, `the command list fits the phone: ${JSON.stringify(listBox)}`);
    await v.shot('controls-phone');
    await page.keyboard.press('Escape');
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});

// What the showcase does not send: grouped options, a boolean option, a refused change, commands
// that arrive a moment after session/new (as real agents send them), an agent that switches its
// own mode, PromptResponse `usage`, and per-session state while another session is shown.
describe('session controls: scripted agent (tests/agents/controls_agent.py)', () => {
  let gw;
  let browser;

  before(async () => {
    gw = await startGateway({
      agent: `/usr/bin/python3 ${path.join(REPO, 'tests/agents/controls_agent.py')}`,
      env: { ACP_GATEWAY_WORKSPACE_ROOTS: '{data_dir}/workspaces/{user},{data_dir}/projects/{user}' },
    });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  it('two roots, grouped and boolean options, slash completion, usage tokens, per-session state', async () => {
    const v = await browser.open(gw, DESKTOP);
    const { page } = v;
    await connected(page);

    // --- two workspace roots: the picker offers a switch; a typed path outside them is not asked about ---
    const projects = path.join(gw.tmp, 'projects', 'local');
    await byId(page, 'cwd-input').fill('/etc');
    await byId(page, 'cwd-browse').click();
    await waitUntil('the first root listed', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(gw.workspaceRoot('local')), { ms: STEP_MS });
    assert.deepEqual(await byId(page, 'cwd-roots').evaluate((s) => [...s.options].map((o) => o.value)), [gw.workspaceRoot('local'), projects]);
    await byId(page, 'cwd-roots').selectOption(projects);
    await waitUntil('the second root listed', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(projects), { ms: STEP_MS });
    // A folder that exists already: the gateway's refusal is shown in the dialog.
    await byId(page, 'cwd-new-folder').click();
    await byId(page, 'cwd-new-name').fill('app');
    await byId(page, 'cwd-create').click();
    await waitUntil('app opened', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith('/app'), { ms: STEP_MS });
    await byId(page, 'cwd-up').click();
    await waitUntil('the second root again', async () => (await byId(page, 'cwd-chosen').innerText()).endsWith(projects), { ms: STEP_MS });
    await byId(page, 'cwd-new-folder').click();
    await byId(page, 'cwd-new-name').fill('app');
    await byId(page, 'cwd-new-name').press('Enter');
    await byId(page, 'cwd-error').waitFor();
    assert.match(await byId(page, 'cwd-error').innerText(), /^Cannot create “app”: already exists/);
    await byId(page, 'cwd-new-name').fill('../escape');
    await byId(page, 'cwd-new-name').press('Enter');
    assert.match(await byId(page, 'cwd-error').innerText(), /cannot be empty, “.” or “..”, or contain “\/”/);
    await byId(page, 'cwd-use').click();
    assert.equal(await byId(page, 'cwd-input').inputValue(), projects);
    await byId(page, 'new-session').click();
    const mode = byId(page, 'mode-select');
    await mode.waitFor();
    assert.deepEqual(await optionsOf(mode), [['normal', 'Normal'], ['yolo', 'YOLO']]);
    const model = page.locator('[data-testid="config-select"][data-config-id="model"]');
    assert.deepEqual(await model.evaluate((s) => [...s.querySelectorAll('optgroup')].map((g) => [g.label, [...g.children].map((o) => o.value)])),
      [['Fast', ['mini', 'broken']], ['Smart', ['maxi']]]);
    assert.equal(await model.inputValue(), 'mini');
    const web = page.locator('[data-testid="config-toggle"][data-config-id="web"]');
    assert.equal(await web.isChecked(), false);
    assert.equal(await page.locator('[data-key="config:web"] .control-name').innerText(), 'Web search');
    const [created] = await sessions(page, gw.base);
    assert.equal(created.cwd, projects, 'the session runs in the second root');
    const sessionOne = created.sessionId;

    // --- slash completion: keyboard (arrows wrap, Enter/Tab accept, Escape closes) and mouse ---
    const input = byId(page, 'prompt-input');
    const list = byId(page, 'slash-list');
    assert.deepEqual(await slashOffered(page, { keepOpen: true }), ['review', 'compact', 'init']);
    const selected = () => page.locator('[data-testid="slash-option"][aria-selected="true"]').getAttribute('data-name');
    assert.equal(await selected(), 'review');
    assert.equal(await input.getAttribute('aria-controls'), 'slash-list');
    assert.equal(await input.getAttribute('aria-autocomplete'), 'list');
    await page.keyboard.press('ArrowDown');
    await page.keyboard.press('ArrowDown');
    assert.equal(await selected(), 'init');
    assert.equal(await input.getAttribute('aria-activedescendant'), await page.locator('[data-testid="slash-option"][data-name="init"]').getAttribute('id'));
    await page.keyboard.press('ArrowDown');
    assert.equal(await selected(), 'review', 'ArrowDown wraps');
    await page.keyboard.press('ArrowUp');
    assert.equal(await selected(), 'init', 'ArrowUp wraps');
    await page.keyboard.press('Escape');
    await list.waitFor({ state: 'hidden' });
    assert.equal(await input.inputValue(), '/');
    assert.equal(await input.getAttribute('aria-activedescendant'), null);
    await page.keyboard.type('c');
    await list.waitFor();
    assert.deepEqual(await byId(page, 'slash-option').evaluateAll((els) => els.map((e) => e.dataset.name)), ['compact']);
    assert.match(await byId(page, 'slash-option').innerText(), /Compact the conversation/);
    await page.keyboard.press('Enter');
    assert.equal(await input.inputValue(), '/compact ', 'Enter accepts and does not send');
    assert.equal(await page.locator('[data-testid="message-user"]').count(), 0);
    await input.fill('');
    await page.keyboard.type('/re');
    await list.waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await input.inputValue(), '/review ');
    assert.equal(await byId(page, 'slash-hint').innerText(), '/review what to review');
    await page.keyboard.type('x');
    await byId(page, 'slash-hint').waitFor({ state: 'hidden' });
    await input.fill('');
    await page.keyboard.type('/');
    await list.waitFor();
    await v.shot('controls-slash-desktop');
    assert.deepEqual(await axeBlocking(page), [], 'axe with the controls and the command list open');
    await page.locator('[data-testid="slash-option"][data-name="init"]').click();
    assert.equal(await input.inputValue(), '/init ');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'prompt-input', 'focus stays in the prompt box');
    await input.fill('');

    // --- options: a grouped select, a boolean toggle, the mode; the reply says what it used ---
    await model.selectOption('maxi');
    await web.check();
    await mode.selectOption('yolo');
    await waitUntil('the options applied', async () => await model.inputValue() === 'maxi' && await web.isChecked() && await mode.inputValue() === 'yolo', { ms: STEP_MS });
    await send(page, 'first');
    assert.equal(await lastAgentText(page), 'model=maxi mode=yolo web=on');
    const turnLine = byId(page, 'turn-usage');
    await turnLine.first().waitFor();
    assert.equal(await turnLine.first().innerText(),
      'This turn: context +1.5K tokens (1.5K of 10K) · cost €0.25 · 1,234 tokens (1,000 in, 200 out, 34 thought)');
    assert.equal(await byId(page, 'usage-cost').innerText(), '€0.25');
    assert.equal(await byId(page, 'usage-context').innerText(), '1.5K / 10K');
    assert.equal(await page.locator('meter.usage-meter').evaluate((m) => m.value), 0.15);

    // --- a refused change: reverted, the agent's error shown ---
    await model.selectOption('broken');
    await byId(page, 'control-error').waitFor();
    assert.equal(await byId(page, 'control-error').innerText(), 'Could not change the model: model broken is unavailable right now');
    await waitUntil('reverted', async () => await model.inputValue() === 'maxi', { ms: STEP_MS });

    // --- the agent switches its own mode and adds a command ---
    await mode.selectOption('normal');
    await waitUntil('normal', async () => await mode.inputValue() === 'normal', { ms: STEP_MS });
    await send(page, 'now switch yourself');
    await waitUntil('the agent switched to yolo', async () => await mode.inputValue() === 'yolo', { ms: STEP_MS });
    assert.equal(await lastAgentText(page), 'model=maxi mode=yolo web=on');
    assert.deepEqual(await slashOffered(page), ['review', 'compact', 'init', 'yolo-only']);
    await waitUntil('a second turn line', async () => await turnLine.count() === 2, { ms: STEP_MS });
    assert.equal(await turnLine.nth(1).innerText(),
      'This turn: context +1.5K tokens (3K of 10K) · cost €0.25 · 1,234 tokens (1,000 in, 200 out, 34 thought)');
    assert.equal(await byId(page, 'usage-cost').innerText(), '€0.50');

    // --- another session has its own state; the first one's is kept while it is away ---
    await byId(page, 'new-session').click();
    await waitUntil('the second session', async () => (await sessions(page, gw.base)).length === 2, { ms: STEP_MS });
    await waitUntil('its own controls', async () => await mode.inputValue() === 'normal' && await model.inputValue() === 'mini' && !(await web.isChecked()), { ms: STEP_MS });
    assert.equal(await byId(page, 'session-usage').isVisible(), false);
    assert.deepEqual(await slashOffered(page), ['review', 'compact', 'init']);
    await page.locator(`[data-testid="session-item"][data-session-id="${sessionOne}"] .session-open`).click();
    await waitUntil('the first session back', async () => await mode.inputValue() === 'yolo' && await model.inputValue() === 'maxi' && await web.isChecked(), { ms: STEP_MS });
    assert.equal(await byId(page, 'usage-cost').innerText(), '€0.50');
    assert.deepEqual(await slashOffered(page), ['review', 'compact', 'init', 'yolo-only']);
    await waitUntil('two turn lines replayed', async () => await turnLine.count() === 2, { ms: STEP_MS });

    // --- after a reload: the replayed updates bring the options, commands and usage back ---
    await page.reload();
    await connected(page);
    await page.locator(`[data-testid="session-item"][data-session-id="${sessionOne}"] .session-open`).click();
    await waitUntil('options after reload', async () => await model.inputValue() === 'maxi' && await web.isChecked(), { ms: STEP_MS });
    await waitUntil('usage after reload', async () => (await byId(page, 'usage-cost').innerText()) === '€0.50', { ms: STEP_MS });
    assert.deepEqual(await slashOffered(page), ['review', 'compact', 'init', 'yolo-only']);
    await waitUntil('two turn lines after reload', async () => await turnLine.count() === 2, { ms: STEP_MS });
    // The PromptResponse tokens are not part of the stored transcript: the replayed lines say the rest.
    assert.deepEqual(await turnLine.allInnerTexts(), [
      'This turn: context +1.5K tokens (1.5K of 10K) · cost €0.25',
      'This turn: context +1.5K tokens (3K of 10K) · cost €0.25',
    ]);
    await waitUntil('the mode after reload (session/load answers with modes)', async () => await mode.isVisible() && await mode.inputValue() === 'yolo', { ms: STEP_MS });

    // --- another tab on the same session follows a change made here ---
    const other = await v.newPage();
    await connected(other);
    await other.locator(`[data-testid="session-item"][data-session-id="${sessionOne}"] .session-open`).click();
    const otherModel = other.locator('[data-testid="config-select"][data-config-id="model"]');
    await waitUntil('the other tab shows the session', async () => await otherModel.inputValue() === 'maxi', { ms: STEP_MS });
    await model.selectOption('mini');
    await mode.selectOption('normal');
    await waitUntil('the other tab follows', async () => await otherModel.inputValue() === 'mini'
      && await byId(other, 'mode-select').inputValue() === 'normal', { ms: STEP_MS });
    // A turn this tab runs gets its usage line in the other one too, and the session's cost there.
    await waitUntil('the other tab replayed both lines', async () => await byId(other, 'turn-usage').count() === 2, { ms: STEP_MS });
    await send(page, 'from the first tab');
    await waitUntil('the other tab shows the turn line', async () => await byId(other, 'turn-usage').count() === 3, { ms: STEP_MS });
    assert.equal(await byId(other, 'turn-usage').nth(2).innerText(), 'This turn: context +1.5K tokens (4.5K of 10K) · cost €0.25');
    assert.equal(await byId(other, 'usage-cost').innerText(), '€0.75');
    await other.close();

    // Chromium logs the 409 of the refused POST /api/fs/dirs itself; that answer was the point.
    const errors = v.errors();
    errors.console = errors.console.filter((line) => !/status of 409 .*\/api\/fs\/dirs/.test(line));
    assert.deepEqual(errors, NO_ERRORS);
    await v.close();
  });

  it('phone: the command list, the controls and the usage line fit', async () => {
    const v = await browser.open(gw, PHONE);
    const { page } = v;
    await connected(page);
    await send(page, 'hello from a phone');
    await byId(page, 'turn-usage').waitFor();
    await byId(page, 'mode-select').waitFor();
    assert.deepEqual(await slashOffered(page, { keepOpen: true }), ['review', 'compact', 'init']);
    for (const id of ['slash-list', 'session-controls', 'session-usage', 'turn-usage']) {
      const b = await byId(page, id).boundingBox();
      assert.ok(b && b.x >= 0 && b.x + b.width <= 390 + 0.5, `${id} fits the phone: ${JSON.stringify(b)}`);
    }
    await v.shot('controls-slash-phone');
    await page.keyboard.press('Escape');
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});
