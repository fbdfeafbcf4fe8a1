// Your own MCP servers (issue 20, item 4): a user adds an HTTP MCP server with a secret header in
// the settings dialog; it is listed by header name only (the value is nowhere in the page again),
// and the next session's agent gets it with the header (a probe agent records what it is sent).
// Another user neither sees it nor gets it. Edited without retyping the value, the stored value is
// kept; removed, it is gone. Phone-sized; screenshot mcp-servers-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test mcp.test.mjs`.

import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { connected, NO_ERRORS, openBrowser, PHONE, REPO, scenario, shutdown, startGateway, waitUntil } from './harness.mjs';

const SECRET = 'Bearer ui-s3cret-41c9';

describe('your own MCP servers', { timeout: 240_000 }, () => {
  let gw;
  let browser;
  let v;
  let page;
  const step = scenario(async () => {
    await v?.shot('mcp-failure').catch(() => {});
    console.error(gw?.log?.());
  });

  before(async () => {
    gw = await startGateway({ agent: `/usr/bin/python3 ${path.join(REPO, 'tests/agents/probe_agent.py')}` });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  /** The `mcpServers` of every `session/new` `user`'s probe agent was sent. */
  const sent = (user) => {
    const file = path.join(gw.tmp, 'homes', user, 'probe-stdin.jsonl');
    if (!existsSync(file)) return [];
    return readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
      .filter((m) => m.method === 'session/new').map((m) => m.params.mcpServers);
  };
  /** Opens the phone's session drawer, unless it is open. */
  const drawer = async (p) => {
    if (await p.getByTestId('sidebar-toggle').getAttribute('aria-expanded') !== 'true') await p.getByTestId('sidebar-toggle').click();
  };
  const openSettings = async (p) => {
    await drawer(p);
    await p.getByTestId('mcp-open').click();
    await p.getByTestId('mcp-dialog').waitFor();
  };
  const newSession = async (p) => {
    await drawer(p);
    await p.getByTestId('new-session').click();
  };

  step('a server with a secret header is saved and listed by header name only', async () => {
    v = await browser.open(gw, PHONE);
    page = v.page;
    await connected(page);
    await openSettings(page);
    await page.getByTestId('mcp-name').fill('tools');
    await page.getByTestId('mcp-url').fill('http://127.0.0.1:9/mcp');
    await page.getByTestId('mcp-header-name').first().fill('Authorization');
    await page.getByTestId('mcp-header-value').first().fill(SECRET);
    await page.getByTestId('mcp-save').click();
    await page.getByTestId('mcp-server').filter({ hasText: 'tools' }).waitFor();
    assert.equal(await page.getByTestId('mcp-header-names').innerText(), 'Authorization: ••••');
    assert.equal(await page.getByTestId('mcp-header-value').first().inputValue(), '', 'the form is cleared');
    assert.ok(!(await page.content()).includes('s3cret'), 'the value is nowhere in the page');
    await v.shot('mcp-servers-phone');
    await page.getByTestId('mcp-close').click();
  });

  step("the next session's agent gets it, with the header; another user's does not", async () => {
    await newSession(page);
    await waitUntil('the probe got a session/new', () => sent('local').length === 1);
    assert.deepEqual(sent('local')[0], [{ type: 'http', name: 'tools', url: 'http://127.0.0.1:9/mcp', headers: [{ name: 'Authorization', value: SECRET }] }]);

    const bob = await browser.open(gw, { ...PHONE, user: 'bob' });
    await connected(bob.page);
    await openSettings(bob.page);
    await bob.page.getByTestId('mcp-list').getByText('None yet.').waitFor();
    await bob.page.getByTestId('mcp-close').click();
    await newSession(bob.page);
    await waitUntil("bob's probe got a session/new", () => sent('bob').length === 1);
    assert.deepEqual(sent('bob')[0], []);
    assert.deepEqual(bob.errors(), NO_ERRORS);
    await bob.close();
  });

  step('edited without retyping the value, the stored one is kept; removed, it is gone', async () => {
    await openSettings(page);
    await page.getByTestId('mcp-server').getByRole('button', { name: 'Edit tools' }).click();
    await page.getByTestId('mcp-url').fill('http://127.0.0.1:9/v2');
    await page.getByTestId('mcp-save').click();
    await page.getByTestId('mcp-server').filter({ hasText: '/v2' }).waitFor();
    await page.getByTestId('mcp-close').click();
    await newSession(page);
    await waitUntil('a second session/new', () => sent('local').length === 2);
    assert.equal(sent('local')[1][0].url, 'http://127.0.0.1:9/v2');
    assert.equal(sent('local')[1][0].headers[0].value, SECRET);

    await openSettings(page);
    await page.getByTestId('mcp-remove').click();
    await page.getByTestId('mcp-list').getByText('None yet.').waitFor();
    assert.deepEqual(v.errors(), NO_ERRORS);
    await v.close();
  });
});
