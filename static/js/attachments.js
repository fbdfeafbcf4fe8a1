// Attachments in a prompt: images (pasted, dropped, or picked; on a phone the picker offers the
// camera and the gallery) as ACP `image` blocks, text files as embedded `resource` blocks, each
// only where the agent's `promptCapabilities` allow it (`image`, `embeddedContext`), and all of
// them together within the gateway's cap (`initialize` → `_meta.gateway.attachmentBytes`, set by
// `[limits] attachment_bytes`). What does not fit is refused when it is added, with the reason,
// never at sending. A large photo is scaled down (longest side 2048 px, JPEG) before that check:
// a phone's camera makes pictures several times the cap. Thumbnails are data: URLs (the CSP
// allows nothing else), never fetched from anywhere.
//
//   const a = new Attachments({ tray, picker, button, onError });
//   a.configure(promptCapabilities, capBytes)   after each `initialize`
//   await a.add(files)                          from the picker, a paste or a drop
//   a.blocks() / a.count / a.clear()            at sending

import { el } from './dom.js';

/** Image types an ACP image block may carry and the UI shows (js/content.js says the same). */
const IMAGE_TYPES = /^image\/(?:png|gif|jpeg|webp|avif|bmp)$/;
/** Longest side of an image sent as it is; larger ones are scaled down. */
const MAX_SIDE = 2048;
/** Text files larger than this are refused even under the cap (an attachment is context, not a dump). */
const MAX_TEXT_FILE = 1 << 20;

/** "1.2 MB", "34 KB", "12 bytes". */
export function size(bytes) {
  if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(1)} MB`;
  if (bytes >= 1e3) return `${Math.round(bytes / 1e3)} KB`;
  return `${bytes} bytes`;
}

/** Bytes a base64 string decodes to. */
function decoded(base64) {
  const pad = base64.endsWith('==') ? 2 : base64.endsWith('=') ? 1 : 0;
  return Math.floor((base64.length * 3) / 4) - pad;
}

function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error ?? new Error('the file could not be read'));
    reader.readAsDataURL(blob);
  });
}

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error('it is not an image this browser can read'));
    img.src = url;
  });
}

/** `file` as `{ mimeType, data }`, scaled down to MAX_SIDE (as JPEG) when larger or over `room`. */
async function imageData(file, room) {
  const url = await readAsDataUrl(file);
  const data = url.slice(url.indexOf(',') + 1);
  const img = await loadImage(url);
  const side = Math.max(img.naturalWidth, img.naturalHeight);
  if (side <= MAX_SIDE && decoded(data) <= room) return { mimeType: file.type, data, url };
  const scale = Math.min(1, MAX_SIDE / side);
  const canvas = document.createElement('canvas');
  canvas.width = Math.max(1, Math.round(img.naturalWidth * scale));
  canvas.height = Math.max(1, Math.round(img.naturalHeight * scale));
  canvas.getContext('2d').drawImage(img, 0, 0, canvas.width, canvas.height);
  const smaller = canvas.toDataURL('image/jpeg', 0.85);
  return { mimeType: 'image/jpeg', data: smaller.slice(smaller.indexOf(',') + 1), url: smaller };
}

export class Attachments {
  /** `input` takes pasted files and `dropZone` dropped ones (pasted text stays text). */
  constructor({ tray, picker, button, input, dropZone, onError }) {
    this.tray = tray;
    this.picker = picker;
    this.button = button;
    this.onError = onError;
    this.items = []; // { name, bytes, block, node }
    this.images = false;
    this.files = false;
    this.cap = 0;
    button.addEventListener('click', () => picker.click());
    picker.addEventListener('change', async () => {
      const files = [...picker.files];
      picker.value = ''; // the same file may be picked again after removing it
      await this.add(files);
    });
    // A pasted screenshot, a photo dropped in.
    input.addEventListener('paste', (event) => this.#take(event, event.clipboardData));
    dropZone.addEventListener('dragover', (event) => {
      if (this.possible && event.dataTransfer?.types?.includes('Files')) event.preventDefault();
    });
    dropZone.addEventListener('drop', (event) => this.#take(event, event.dataTransfer));
    this.configure(null, 0);
  }

  /** The files `transfer` carries, if any and if this agent takes attachments. */
  #take(event, transfer) {
    const files = [...(transfer?.files ?? [])];
    if (!files.length || !this.possible) return;
    event.preventDefault();
    this.add(files);
  }

  /** What the agent takes (`promptCapabilities`) and the gateway's cap in bytes. */
  configure(caps, capBytes) {
    this.images = caps?.image === true;
    this.files = caps?.embeddedContext === true;
    this.cap = Number.isFinite(capBytes) && capBytes > 0 ? capBytes : 0;
    const accepts = [this.images && 'image/*', this.files && 'text/*,.md,.txt,.json,.csv,.log,.yaml,.yml,.toml,.rs,.py,.js,.ts,.go,.java,.c,.h,.cpp,.sh,.html,.css,.sql']
      .filter(Boolean);
    this.picker.accept = accepts.join(',');
    this.button.hidden = !accepts.length || !this.cap;
    this.button.title = this.images && this.files ? 'Attach images or text files'
      : this.images ? 'Attach images' : 'Attach text files';
    this.button.setAttribute('aria-label', this.button.title);
  }

  /** Whether this agent takes any attachment. */
  get possible() {
    return !this.button.hidden;
  }

  get count() {
    return this.items.length;
  }

  get bytes() {
    return this.items.reduce((sum, item) => sum + item.bytes, 0);
  }

  /** Adds what fits; says why for each file that does not. */
  async add(files) {
    for (const file of files) {
      try {
        await this.#addOne(file);
      } catch (err) {
        this.onError(`${file.name || 'The file'} was not attached: ${err.message}`);
      }
    }
  }

  async #addOne(file) {
    if (!this.possible) throw new Error('this agent takes no attachments');
    const room = this.cap - this.bytes;
    const name = file.name || (file.type.startsWith('image/') ? 'pasted image' : 'pasted text');
    if (file.type.startsWith('image/')) {
      if (!this.images) throw new Error('this agent does not take images');
      if (!IMAGE_TYPES.test(file.type)) throw new Error(`${file.type} is not an image type the agent is sent`);
      const { mimeType, data, url } = await imageData(file, room);
      const bytes = decoded(data);
      this.#fits(bytes, room);
      this.#push({ name, bytes, block: { type: 'image', mimeType, data }, thumb: url });
      return;
    }
    if (!this.files) throw new Error('this agent does not take files (only text can be sent)');
    if (file.size > MAX_TEXT_FILE) throw new Error(`it is ${size(file.size)}; a text file may be ${size(MAX_TEXT_FILE)} at most`);
    const text = await file.text();
    if (text.includes('\u0000') || text.includes('\uFFFD')) throw new Error('it is not a UTF-8 text file');
    const bytes = new TextEncoder().encode(text).length;
    this.#fits(bytes, room);
    const uri = `attachment:///${encodeURIComponent(name)}`;
    this.#push({ name, bytes, block: { type: 'resource', resource: { uri, mimeType: file.type || 'text/plain', text } } });
  }

  #fits(bytes, room) {
    if (bytes > room) {
      throw new Error(`it is ${size(bytes)}, and a prompt's attachments may hold ${size(this.cap)} in all`
        + (this.items.length ? ` (${size(this.cap - room)} attached already)` : ''));
    }
  }

  #push({ name, bytes, block, thumb }) {
    const item = { name, bytes, block };
    const remove = el('button', {
      type: 'button', class: 'attachment-remove', text: '×', testid: 'attachment-remove',
      'aria-label': `Remove ${name}`,
    });
    item.node = el('li', { class: 'attachment', testid: 'attachment', title: `${name}, ${size(bytes)}` },
      thumb ? el('img', { src: thumb, alt: name, class: 'attachment-thumb' })
        : el('span', { class: 'attachment-file', text: (name.split('.').pop() || 'txt').slice(0, 4).toUpperCase() }),
      el('span', { class: 'attachment-name', text: name }),
      el('span', { class: 'attachment-size', text: size(bytes) }),
      remove);
    remove.addEventListener('click', () => {
      this.items = this.items.filter((other) => other !== item);
      item.node.remove();
      this.tray.hidden = !this.items.length;
    });
    this.items.push(item);
    this.tray.append(item.node);
    this.tray.hidden = false;
  }

  /** The ACP content blocks, in the order they were attached. */
  blocks() {
    return this.items.map((item) => item.block);
  }

  /** Puts blocks back (a prompt that could not be sent). */
  restore(blocks) {
    for (const block of blocks) {
      const name = block.type === 'image' ? 'image'
        : decodeURIComponent(String(block.resource?.uri ?? '').replace(/^attachment:\/\/\//, '')) || 'file';
      const bytes = block.type === 'image' ? decoded(block.data) : new TextEncoder().encode(block.resource?.text ?? '').length;
      this.#push({ name, bytes, block, thumb: block.type === 'image' ? `data:${block.mimeType};base64,${block.data}` : null });
    }
  }

  clear() {
    this.items = [];
    this.tray.replaceChildren();
    this.tray.hidden = true;
  }
}
