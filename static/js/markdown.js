// Markdown for messages: marked (CommonMark + GFM) → DOMPurify (strict allow-list) → DOM, with
// highlight.js code blocks that carry a language label and a Copy button.
//
// Agent text is untrusted. The layers, outermost first:
//   1. marked's renderer shows raw HTML as text, except a few harmless tags stripped of their
//      attributes (so `Vec<String>` stays visible instead of vanishing as an unknown tag), and turns
//      a Markdown image whose source the page may not load (CSP img-src is 'self' data:) into a
//      link labelled with its alt text.
//   2. DOMPurify with an allow-list of tags and attributes (no script, style, iframe, object, embed,
//      form, svg, math; no id/name/style/event-handler attributes; URIs limited to http(s), mailto
//      and relative), plus a hook that re-checks every link and image and marks links
//      target=_blank rel="noopener noreferrer nofollow".
//   3. Structural touches on the sanitized fragment while it still belongs to DOMPurify's inert
//      document (nothing in it loads or runs before it is appended): code blocks, table wrappers,
//      read-only task-list checkboxes.
//
// MarkdownStream renders a message that grows chunk by chunk without re-parsing all of it: text
// up to the last settle point (a blank line outside a code fence, a closed fence, the start of a
// fence) is rendered once and frozen; only the tail after it is rendered again, at most once per
// call of render() (the Conversation calls it once per animation frame).

import { Marked } from '../vendor/marked.js';
import DOMPurify from '../vendor/purify.js';
import hljs from '../vendor/highlight.js';
import { el } from './dom.js';

// --- policy --------------------------------------------------------------------------------------

/** Raw HTML tags shown as such (after DOMPurify); every other tag is shown as text. */
const RAW_HTML_TAGS = ['b', 'i', 'em', 'strong', 'u', 's', 'del', 'ins', 'mark', 'sub', 'sup', 'kbd',
  'code', 'small', 'br', 'details', 'summary', 'abbr', 'q', 'dl', 'dt', 'dd'];
const RAW_TAG_SET = new Set(RAW_HTML_TAGS);
/** A tag (group 1: `/` of an end tag, group 2: name), a comment, or any other `<`. Nothing in a
 *  tag may be a `<`: otherwise every `<` of a block of unclosed `<a b` lines scanned to the end
 *  of the block (16,000 such lines: 18 s; now 41 ms). */
const RAW_MARKUP = /<(\/?)([A-Za-z][A-Za-z0-9-]*)(?:\s(?:[^<>"']|"[^"<]*"|'[^'<]*')*)?\/?>|<!--[\s\S]*?(?:-->|$)|</g;
/** Tags from RAW_HTML_TAGS that make a raw HTML block more than a paragraph of text. */
const RAW_BLOCK_TAG = /<\/?(?:details|summary|dl|dt|dd)>/;

/**
 * Raw HTML from the agent: tags from RAW_HTML_TAGS are kept without any attribute (DOMPurify then
 * never even parses an event handler, which Chrome would report as a CSP violation), comments are
 * dropped, everything else is shown as text.
 */
function rawHtml(text, block) {
  const shown = text.replace(RAW_MARKUP, (markup, end, name) => {
    if (markup.startsWith('<!--')) return '';
    if (name && RAW_TAG_SET.has(name.toLowerCase())) return `<${end}${name.toLowerCase()}>`;
    return escapeHtml(markup);
  });
  return block && !RAW_BLOCK_TAG.test(shown) ? `<p>${shown}</p>` : shown;
}

const ALLOWED_TAGS = ['a', 'blockquote', 'br', 'code', 'del', 'em', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6',
  'hr', 'img', 'input', 'li', 'ol', 'p', 'pre', 'strong', 'table', 'tbody', 'td', 'th', 'thead', 'tr',
  'ul', ...RAW_HTML_TAGS];
const ALLOWED_ATTR = ['href', 'title', 'alt', 'src', 'type', 'checked', 'disabled', 'start', 'align', 'class'];

const SANITIZE = {
  ALLOWED_TAGS,
  ALLOWED_ATTR,
  // DOMPurify's default shape, fewer schemes: http(s), mailto, or no scheme at all (relative).
  // The hook below narrows links further; data: is never a link.
  ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  ALLOW_UNKNOWN_PROTOCOLS: false,
  // Not in ALLOWED_TAGS either; listed so that a later widening of the allow-list cannot bring them back.
  FORBID_TAGS: ['script', 'style', 'iframe', 'object', 'embed', 'form', 'svg', 'math',
    'template', 'link', 'meta', 'base', 'frame', 'frameset', 'audio', 'video', 'source', 'textarea',
    'select', 'button'],
  FORBID_ATTR: ['style', 'id', 'name', 'srcset', 'action', 'formaction', 'xlink:href', 'target', 'rel'],
  RETURN_DOM_FRAGMENT: true,
};

const IMAGE_DATA_URL = /^data:image\/(?:png|gif|jpe?g|webp|avif|bmp|x-icon|svg\+xml);base64,[a-z0-9+/=\s]*$/i;

/** An absolute http(s) or mailto URL, normalized; anything else (javascript:, data:, relative…) is null. */
export function linkHref(raw) {
  const text = String(raw ?? '').trim();
  if (!/^(?:https?:\/\/|mailto:)/i.test(text)) return null;
  try {
    const url = new URL(text);
    return ['http:', 'https:', 'mailto:'].includes(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/** A source the page may load as an image (CSP img-src 'self' data:): data:image/* or same origin. */
export function imageSrc(raw) {
  const text = String(raw ?? '').trim();
  if (IMAGE_DATA_URL.test(text)) return text.replace(/\s+/g, '');
  if (/^[a-z][a-z0-9+.-]*:/i.test(text) && !/^https?:/i.test(text)) return null;
  try {
    const url = new URL(text, location.href);
    // Same origin, but never the gateway's own routes (an image must not be able to spend a login
    // code, say): only what static/ serves.
    const path = decodeURIComponent(url.pathname).toLowerCase();
    if (url.origin !== location.origin || /^\/+(?:auth|acp|api)(?:[/?#]|$)/.test(path)) return null;
    return url.href;
  } catch {
    return null;
  }
}

const purify = DOMPurify(window);
purify.addHook('afterSanitizeAttributes', (node) => {
  // Classes only as marked writes them on code (`language-x`): agent HTML must not borrow the UI's.
  const cls = node.getAttribute?.('class');
  if (cls != null && !(node.tagName === 'CODE' && /^language-[\w+#.-]{1,40}$/.test(cls))) node.removeAttribute('class');
  switch (node.tagName) {
    case 'A': {
      const href = linkHref(node.getAttribute('href'));
      if (!href) {
        node.removeAttribute('href');
      } else {
        node.setAttribute('href', href);
        node.setAttribute('rel', 'noopener noreferrer nofollow');
        if (!href.startsWith('mailto:')) node.setAttribute('target', '_blank');
      }
      break;
    }
    case 'IMG': {
      const src = imageSrc(node.getAttribute('src'));
      if (src) node.setAttribute('src', src);
      else node.removeAttribute('src'); // dropped below; marked already made remote images links
      node.setAttribute('loading', 'lazy');
      node.setAttribute('referrerpolicy', 'no-referrer');
      break;
    }
    case 'INPUT':
      node.setAttribute('disabled', ''); // GFM task lists are read-only; other types are removed below
      break;
    default:
  }
});

// --- marked --------------------------------------------------------------------------------------

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const escapeHtml = (text) => String(text ?? '').replace(/[&<>"']/g, (c) => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  renderer: {
    html({ text, block }) {
      return rawHtml(text, block);
    },
    image({ href, title, text }) {
      const alt = text || title || 'image';
      const src = imageSrc(href);
      if (src) return `<img src="${escapeHtml(src)}" alt="${escapeHtml(alt)}"${title ? ` title="${escapeHtml(title)}"` : ''}>`;
      // A remote image would break the CSP: offer it as a link named by its alt text.
      return linkHref(href) ? `<a href="${escapeHtml(href)}">${escapeHtml(alt)}</a>` : escapeHtml(`[${alt}]`);
    },
  },
});

/** Block tokens of `src` (marked's lexer), for MarkdownStream's forced splits. */
const lex = (src) => marked.lexer(src);

// --- code blocks ---------------------------------------------------------------------------------

/** Longest code highlighted (the rest shows plain); guessing a language is costlier, so shorter. */
const HIGHLIGHT_MAX = 50_000;
const AUTO_MAX = 2_000;

function languageOf(code) {
  return /^language-([\w+#.-]+)$/.exec(code.getAttribute('class') ?? '')?.[1].toLowerCase() ?? '';
}

/**
 * Highlights `code` in place. `auto`: guess the language of a short block without one. hljs escapes
 * the text it is given and only adds <span class="hljs-…">, so its output goes in as HTML.
 */
function highlight(code, lang, { auto }) {
  const text = code.textContent;
  if (text.length > HIGHLIGHT_MAX) return lang;
  let result = null;
  if (lang && hljs.getLanguage(lang)) result = hljs.highlight(text, { language: lang, ignoreIllegals: true });
  else if (!lang && auto && text.length <= AUTO_MAX) {
    const guess = hljs.highlightAuto(text);
    if (guess.language && guess.relevance >= 5) result = guess;
  }
  if (!result) return lang;
  code.innerHTML = result.value;
  code.classList.add('hljs');
  return lang || result.language;
}

async function copyCode(button, code) {
  const reset = () => {
    button.textContent = 'Copy';
    button.setAttribute('aria-label', button.dataset.label);
    delete button.dataset.state;
  };
  try {
    await navigator.clipboard.writeText(code.textContent);
    button.textContent = 'Copied';
    button.setAttribute('aria-label', 'Copied');
    button.dataset.state = 'copied';
  } catch {
    // No clipboard permission (or no secure context): select the code so Ctrl+C works.
    const range = document.createRange();
    range.selectNodeContents(code);
    getSelection()?.removeAllRanges();
    getSelection()?.addRange(range);
    button.textContent = 'Press Ctrl+C';
    button.setAttribute('aria-label', 'Code selected: press Ctrl+C to copy');
    button.dataset.state = 'selected';
  }
  clearTimeout(button.resetTimer);
  button.resetTimer = setTimeout(reset, 2000);
}

/** Wraps `pre` (holding `code`) in a block with a language label and a Copy button. */
function codeBlock(pre, code, label) {
  const name = label ? `Copy ${label} code` : 'Copy code';
  const copy = el('button', {
    type: 'button', class: 'code-copy', testid: 'code-copy', 'aria-label': name, 'data-label': name, text: 'Copy',
  });
  copy.addEventListener('click', () => copyCode(copy, code));
  pre.tabIndex = 0; // scrollable sideways: reachable by keyboard
  const block = el('div', { class: 'code-block', testid: 'code-block', 'data-lang': label || null },
    el('div', { class: 'code-head' }, el('span', { class: 'code-lang', text: label || 'text' }), copy));
  pre.replaceWith(block);
  block.append(pre);
  return block;
}

/** A code block for text that is still streaming in (a long fence not yet closed): plain, appendable. */
function liveCodeBlock(lang) {
  const code = el('code', lang ? { class: `language-${lang}` } : {});
  const pre = el('pre', {}, code);
  const holder = el('div', {}, pre);
  codeBlock(pre, code, lang);
  return { root: holder.firstElementChild, code };
}

/** A highlighted code block (with label and Copy button) for `text` known to be code, in language `lang` if known. */
export function codeView(text, lang = '') {
  const code = el('code', {}, String(text ?? ''));
  const pre = el('pre', {}, code);
  const holder = el('div', {}, pre);
  const known = lang && hljs.getLanguage(lang) ? lang : '';
  codeBlock(pre, code, highlight(code, known, { auto: !known }));
  return holder.firstElementChild;
}

// --- rendering -----------------------------------------------------------------------------------

/**
 * Renders Markdown `src` to a sanitized DocumentFragment (still owned by DOMPurify's inert document
 * until appended). `auto`: guess the language of short code blocks without one.
 */
export function renderMarkdown(src, { auto = true } = {}) {
  let frag;
  if (hasLongProseLine(src)) {
    // marked's inline parser is quadratic on crafted lines (markedjs/marked#4099: 40 KB of `a_`
    // holds the page for seconds), and one parse cannot be cut into frames: such a line is text.
    frag = document.createDocumentFragment();
    frag.append(el('p', { class: 'md-plain', text: src }));
    return frag;
  }
  try {
    frag = purify.sanitize(marked.parse(src), SANITIZE);
  } catch {
    // Markdown nested past marked's recursion ("Maximum call stack size exceeded", e.g. 5,000 `>`):
    // shown as text, so that one message cannot stop the rest of the conversation from rendering.
    frag = document.createDocumentFragment();
    frag.append(el('p', { text: src }));
    return frag;
  }
  for (const a of frag.querySelectorAll('a:not([href])')) a.replaceWith(...a.childNodes);
  for (const img of frag.querySelectorAll('img:not([src])')) img.replaceWith(img.getAttribute('alt') ?? '');
  for (const input of frag.querySelectorAll('input')) {
    if (input.getAttribute('type') !== 'checkbox') {
      input.remove();
      continue;
    }
    const item = input.closest('li');
    if (item) {
      item.classList.add('task');
      input.setAttribute('aria-label', input.checked ? 'done' : 'to do');
    }
  }
  for (const table of frag.querySelectorAll('table')) {
    const wrap = el('div', { class: 'md-table', tabindex: '0' });
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const code of frag.querySelectorAll('pre > code')) {
    const lang = languageOf(code);
    codeBlock(code.parentElement, code, highlight(code, lang, { auto }));
  }
  return frag;
}

/** Longest line outside a code fence that goes through marked (about 85 ms for the worst case). */
const LONG_LINE = 8_000;

/** Whether `src` has a line longer than LONG_LINE outside a fenced code block. */
function hasLongProseLine(src) {
  if (src.length <= LONG_LINE) return false;
  let fence = null;
  for (const line of src.split('\n')) {
    const open = FENCE.exec(line);
    if (open) {
      if (!fence) fence = open[2];
      else if (open[2][0] === fence[0] && open[2].length >= fence.length && !open[3].trim()) fence = null;
    } else if (!fence && line.length > LONG_LINE) {
      return true;
    }
  }
  return false;
}

// --- streaming -----------------------------------------------------------------------------------

/** Settled text is rendered in pieces of at most about this many UTF-16 units (a longer paragraph,
 *  list or run of blocks is cut at a block or line boundary; a longer code block stays whole). */
const PIECE = 4_000;
/** Work per render() call (ms) after which the rest waits for the next frame. */
const FRAME_BUDGET_MS = 12;
/** Settled text beyond this many UTF-16 units is dropped from memory (only the tail is ever read again). */
const REBASE = 32_000;
/** A message longer than this gets `md-long`: its blocks skip layout while out of view (messages.css). */
const LONG_MESSAGE = 16_000;
/** An open code fence longer than this streams as plain text until it closes. */
const LIVE_FENCE = 3_000;
/** A tail render slower than this (ms) makes the next one wait `SLOW_FACTOR` times as long. */
const SLOW_MS = 8;
const SLOW_FACTOR = 4;

const FENCE = /^([ \t]*)(`{3,}|~{3,})(.*)$/;
const LIST_ITEM = /^ {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)/;

export class MarkdownStream {
  /** @param container {Element} the element the message's blocks are appended to */
  constructor(container) {
    this.el = container;
    this.src = ''; // the text not yet forgotten (see #rebase)
    this.length = 0; // all the text pushed so far
    this.settled = 0; // src[0, settled) is rendered and frozen in the DOM
    this.scanned = 0; // src[0, scanned) is complete lines already scanned for settle points
    this.points = []; // settle points found by the scan, ascending; those <= settled are dropped
    this.fence = null; // the open fenced code block at `scanned`: {marker, length, start, indented}
    this.details = 0; // raw <details> elements open at `scanned`: a blank line inside one settles nothing
    this.blank = 0; // the end of a blank line just scanned: a settle point unless the next line continues a list
    this.tailNodes = []; // the DOM nodes of the rendered tail, replaced on each render
    this.live = null; // {start, root, code, shown}: the plain code block of a long open fence
    this.dirty = false; // text arrived (or settling is behind) since the last complete render
    this.notBefore = 0; // performance.now() before which a slow tail is not rendered again
    this.stats = { renders: 0, pieces: 0, splits: 0, slowestPiece: 0, slowestTail: 0 };
  }

  push(text) {
    if (!text) return;
    this.src += text;
    this.dirty = true;
    this.length += text.length;
    if (this.length > LONG_MESSAGE) this.el.classList.add('md-long');
  }

  /**
   * Brings the DOM up to date, within about FRAME_BUDGET_MS. `final`: the message is over, settle
   * all of it. Returns true when work was left for a later call (the next frame).
   */
  render({ final = false } = {}) {
    if (!this.dirty && !final) return false;
    this.#scan();
    const started = performance.now();
    let now = started;
    for (let target = this.#next(final); target > this.settled; target = this.#next(final)) {
      this.#clearTail();
      this.el.append(renderMarkdown(this.src.slice(this.settled, target)));
      this.settled = target;
      const before = now;
      now = performance.now();
      this.stats.pieces += 1;
      this.stats.slowestPiece = Math.max(this.stats.slowestPiece, now - before);
      if (now - started > FRAME_BUDGET_MS) {
        this.dirty = true;
        return true;
      }
    }
    if (this.settled > REBASE) this.#rebase();
    if (!final && now < this.notBefore) return true;
    this.#renderTail();
    const spent = performance.now() - now;
    this.stats.renders += 1;
    this.stats.slowestTail = Math.max(this.stats.slowestTail, spent);
    this.notBefore = spent > SLOW_MS ? now + spent * SLOW_FACTOR : 0;
    this.dirty = false;
    return false;
  }

  /**
   * Renders the tail once more as a finished block would be (a long open fence highlighted, short
   * blocks without a language guessed) without settling it: for a message that has gone quiet.
   */
  polish() {
    if (this.dirty || this.settled >= this.src.length) return;
    this.#clearTail();
    const frag = renderMarkdown(this.src.slice(this.settled));
    this.tailNodes = [...frag.childNodes];
    this.el.append(frag);
  }

  /** After a failed render: the text not settled yet is shown as plain text, and nothing more. */
  abandon() {
    this.#clearTail();
    this.el.append(el('p', { text: this.src.slice(this.settled) }));
    this.settled = this.src.length;
    this.dirty = false;
  }

  /** Where the next settled piece ends (`settled` when there is none yet). */
  #next(final) {
    while (this.points.length && this.points[0] <= this.settled) this.points.shift();
    const limit = this.settled + PIECE;
    let best = this.settled;
    for (const point of this.points) {
      if (point > limit) break;
      best = point;
    }
    if (best > this.settled) return best;
    const end = final ? this.src.length : this.scanned;
    if (end <= limit) return final ? end : this.settled;
    // More than a piece of text without a settle point in it: cut it.
    const split = this.#split(limit);
    if (split > this.settled) {
      this.stats.splits += 1;
      return split;
    }
    return this.points[0] ?? (final ? end : this.settled);
  }

  /** Forgets the settled text (it is in the DOM): offsets into `src` move down by `settled`. */
  #rebase() {
    const by = this.settled;
    this.src = this.src.slice(by);
    this.settled = 0;
    this.scanned -= by;
    this.points = this.points.map((point) => point - by);
    if (this.blank) this.blank -= by;
    if (this.fence) this.fence.start -= by;
    if (this.live) {
      this.live.start -= by;
      this.live.shown -= by;
    }
  }

  /** Finds settle points in the complete lines that arrived since the last scan. */
  #scan() {
    let from = this.scanned;
    for (let nl = this.src.indexOf('\n', from); nl >= 0; nl = this.src.indexOf('\n', from)) {
      this.#line(this.src.slice(from, nl), from, nl + 1);
      from = nl + 1;
    }
    this.scanned = from;
  }

  #point(at) {
    if (at > this.settled && at > (this.points[this.points.length - 1] ?? 0)) this.points.push(at);
  }

  #line(line, start, end) {
    if (this.blank && line.trim()) {
      // A blank line ends the blocks before it, unless what follows continues them: another item
      // (a loose list) or an indented line (a list item's next paragraph or code).
      if (!LIST_ITEM.test(line) && !/^[ \t]/.test(line)) this.#point(this.blank);
      this.blank = 0;
    }
    const fence = FENCE.exec(line);
    if (this.fence) {
      const closes = fence && fence[2][0] === this.fence.marker && fence[2].length >= this.fence.length && !fence[3].trim();
      if (closes) {
        // Nothing after a closed fence can change it, unless it is indented (in a list item, say).
        if (!this.fence.indented && !this.details) this.#point(end);
        this.fence = null;
      }
      return;
    }
    if (fence && !(fence[2][0] === '`' && fence[3].includes('`'))) {
      // A fence at the margin ends whatever came before it. An indented one may belong to a list item.
      if (!fence[1] && !this.details) this.#point(start);
      this.fence = { marker: fence[2][0], length: fence[2].length, start, indented: !!fence[1] };
      return;
    }
    if (line.includes('<')) {
      const opened = line.match(/<details[\s>]/gi)?.length ?? 0;
      const closed = line.match(/<\/details\s*>/gi)?.length ?? 0;
      this.details = Math.max(0, this.details + opened - closed);
    }
    if (!line.trim() && !this.details) this.blank = end;
  }

  /**
   * A cut in src(settled, limit] for text without a settle point there, from marked's lexer over
   * the complete lines up to `limit`: before the last block, else before the last item of a list,
   * else before the last line of a paragraph. Returns `settled` when none fits (a long code block
   * or table: it is then settled whole).
   */
  #split(limit) {
    const end = this.src.lastIndexOf('\n', limit - 1) + 1;
    const from = this.settled;
    if (end <= from) return from;
    const chunk = this.src.slice(from, end);
    let tokens;
    try {
      tokens = lex(chunk);
    } catch {
      return from; // nested past marked's recursion: renderMarkdown shows it as text
    }
    if (tokens.reduce((n, t) => n + t.raw.length, 0) !== chunk.length) return from; // \r\n: offsets unknown
    const blocks = [];
    let at = from;
    for (const token of tokens) {
      if (token.type !== 'space') blocks.push({ token, at });
      at += token.raw.length;
    }
    if (blocks.length > 1) return blocks[blocks.length - 1].at;
    const only = blocks[0];
    if (!only) return end;
    if (only.token.type === 'list' && only.token.items.length > 1) {
      const last = only.token.items[only.token.items.length - 1].raw;
      const offset = only.token.raw.lastIndexOf(last);
      return offset > 0 ? only.at + offset : from;
    }
    if (only.token.type === 'paragraph') {
      const cut = this.src.lastIndexOf('\n', end - 2) + 1;
      return cut > from ? cut : from;
    }
    return from;
  }

  #renderTail() {
    const tail = this.src.slice(this.settled);
    const fence = this.fence;
    if (fence && fence.start === this.settled && tail.length > LIVE_FENCE) {
      this.#renderLiveFence(fence);
      return;
    }
    this.#clearTail();
    if (!tail) return;
    const frag = renderMarkdown(tail, { auto: false });
    this.tailNodes = [...frag.childNodes];
    this.el.append(frag);
  }

  /** Appends the complete lines of a long open fence to a plain code block; highlighted once closed. */
  #renderLiveFence(fence) {
    const bodyStart = this.src.indexOf('\n', fence.start) + 1;
    if (!this.live || this.live.start !== fence.start) {
      const info = this.src.slice(fence.start, bodyStart).replace(FENCE, '$3').trim().split(/\s+/)[0];
      const lang = /^[\w+#.-]{1,40}$/.test(info) ? info.toLowerCase() : '';
      this.#clearTail();
      const { root, code } = liveCodeBlock(lang);
      this.el.append(root);
      this.tailNodes = [root];
      this.live = { start: fence.start, root, code, shown: bodyStart };
    }
    if (this.scanned > this.live.shown) {
      this.live.code.append(this.src.slice(this.live.shown, this.scanned));
      this.live.shown = this.scanned;
    }
  }

  #clearTail() {
    for (const node of this.tailNodes) node.remove();
    this.tailNodes = [];
    this.live = null;
  }
}
