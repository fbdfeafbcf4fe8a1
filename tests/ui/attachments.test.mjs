// Attachments (issue 20, item 2): an image pasted into the prompt box and a text file picked
// reach the agent as ACP `image` and `resource` blocks (the demo agent says what it got, to the
// byte), show as thumbnails and chips before sending, in the user's message after, and again
// after a reload (replayed from the store); a file over the gateway's cap is refused when it is
// added, with the reason. Phone and desktop. Screenshots: attachments-phone.png,
// attachments-sent-phone.png.
//
// Run: `cargo build && cd tests/ui && node --test attachments.test.mjs`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connected, DESKTOP, NO_ERRORS, openBrowser, PHONE, shutdown, startGateway } from './harness.mjs';

/** The gateway's cap for this test: room for a screenshot, not for the big file. */
const CAP = 200_000;

/** Pastes a PNG drawn in the page into the prompt box, the way a browser pastes a screenshot;
 *  resolves to its size in bytes. */
function pasteScreenshot(page) {
  return page.getByTestId('prompt-input').evaluate(async (input) => {
    const canvas = document.createElement('canvas');
    canvas.width = 320;
    canvas.height = 200;
    const g = canvas.getContext('2d');
    g.fillStyle = '#2a6';
    g.fillRect(0, 0, 320, 200);
    g.fillStyle = '#fff';
    g.fillText('screenshot', 20, 100);
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, 'image/png'));
    const data = new DataTransfer();
    data.items.add(new File([blob], 'screenshot.png', { type: 'image/png' }));
    input.focus();
    input.dispatchEvent(new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true }));
    return blob.size;
  });
}

describe('attachments: images and text files in a prompt', { timeout: 240_000 }, () => {
  let gw;
  let browser;

  before(async () => {
    gw = await startGateway({
      agent: ['demo-agent', '--delay-us', '0', '--chunks', '2'],
      config: `[limits]\nattachment_bytes = ${CAP}\n`,
    });
    browser = await openBrowser();
  });

  after(() => shutdown(browser, gw));

  for (const [label, viewport] of [['phone', PHONE], ['desktop', DESKTOP]]) {
    it(`a pasted image and a picked file reach the agent and stay in the transcript (${label})`, async () => {
      const v = await browser.open(gw, viewport);
      const { page } = v;
      await connected(page);
      const attach = page.getByTestId('attach');
      await attach.waitFor();
      assert.match(await page.getByTestId('attach-picker').getAttribute('accept'), /image\/\*/);

      const pngBytes = await pasteScreenshot(page);
      await page.getByTestId('attachment').first().waitFor();
      await page.getByTestId('attach-picker').setInputFiles({
        name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('remember the milk\n'),
      });
      await page.getByTestId('attachment').nth(1).waitFor();
      // Over the cap: refused when added, with the reason; what was attached stays.
      await page.getByTestId('attach-picker').setInputFiles({
        name: 'big.log', mimeType: 'text/plain', buffer: Buffer.alloc(300_000, 'x'),
      });
      await page.getByText(/big\.log was not attached: it is 300 KB, and a prompt's attachments may hold 200 KB in all/).waitFor();
      assert.equal(await page.getByTestId('attachment').count(), 2);
      const thumb = page.getByTestId('attachment').first().locator('img');
      assert.match(await thumb.getAttribute('src'), /^data:image\/png;base64,/);
      await page.getByTestId('prompt-input').fill('What is in these?');
      if (label === 'phone') await v.shot('attachments-phone');

      await page.getByTestId('send').click();
      const said = page.getByTestId('message-agent').filter({ hasText: 'You attached' });
      await said.waitFor();
      const text = await said.innerText();
      assert.ok(text.includes(`an image (image/png, ${pngBytes} bytes)`), text);
      assert.ok(text.includes('a file attachment:///notes.txt (18 bytes)'), text);
      assert.equal(await page.getByTestId('attachments').isHidden(), true, 'the tray is emptied once sent');
      const user = page.getByTestId('message-user').last();
      await user.getByTestId('content-image').waitFor();
      assert.equal(await user.getByTestId('content-image').count(), 1, 'the echo is not shown twice');
      assert.equal(await user.getByTestId('content-resource').count(), 1);
      await page.getByTestId('send').waitFor();
      if (label === 'phone') await v.shot('attachments-sent-phone');

      if (label === 'desktop') {
        // Replayed from the store: the image and the file are still in the user's message.
        await page.reload();
        await connected(page);
        await page.locator('[data-testid="session-item"] .session-open').first().click();
        const replayed = page.getByTestId('message-user').filter({ hasText: 'What is in these?' });
        await replayed.getByTestId('content-image').waitFor();
        assert.match(await replayed.getByTestId('content-image').locator('img').getAttribute('src'), /^data:image\/png;base64,/);
        assert.equal(await replayed.getByTestId('content-resource').count(), 1);
      }
      assert.deepEqual(v.errors(), NO_ERRORS);
      await v.close();
    });
  }
});
