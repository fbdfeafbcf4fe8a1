// Non-text ACP content blocks in messages: image, audio, resource_link, resource (embedded).
// Everything from the agent goes in as text or through an allow-list: images only as
// data:image/* URLs built from a known image type (CSP img-src 'self' data:), links only to http(s).

import { el, str } from './dom.js';
import { codeView, linkHref } from './markdown.js';

const IMAGE_TYPES = /^image\/(?:png|gif|jpeg|webp|avif|bmp|svg\+xml)$/;
const BASE64 = /^[A-Za-z0-9+/=\s]*$/;

/** `12.3 KB` style, or '' when `bytes` is not a size. */
export function formatSize(bytes) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes) || bytes < 0) return '';
  const units = ['bytes', 'KB', 'MB', 'GB', 'TB'];
  let n = bytes;
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} ${n === 1 ? 'byte' : 'bytes'}` : `${n.toFixed(n < 10 ? 1 : 0)} ${units[unit]}`;
}

/** The last path segment of a URI, for labels. */
function baseName(uri) {
  const path = str(uri).split(/[?#]/)[0].replace(/\/+$/, '');
  const name = path.slice(path.lastIndexOf('/') + 1);
  try {
    return decodeURIComponent(name) || uri;
  } catch {
    return name || uri;
  }
}

/** A language hint for highlight.js from a file name or MIME type (hljs knows extensions as aliases). */
function languageHint(uri, mimeType) {
  const ext = /\.([A-Za-z0-9+#]{1,12})$/.exec(baseName(uri))?.[1]?.toLowerCase();
  if (ext) return ext;
  return /^(?:text|application)\/(?:x-)?([a-z0-9+#-]{1,20})$/.exec(str(mimeType))?.[1] ?? '';
}

/** A URI as a link when it is http(s), else as code text. */
function uriView(uri, label) {
  const href = linkHref(uri);
  if (href && !href.startsWith('mailto:')) {
    return el('a', { href, target: '_blank', rel: 'noopener noreferrer nofollow', text: label || uri });
  }
  return el('code', { class: 'content-uri', text: label && label !== uri ? `${label} (${uri})` : uri });
}

function image(block) {
  const mime = str(block.mimeType).toLowerCase();
  const data = str(block.data);
  const label = str(block.uri) ? baseName(block.uri) : 'image';
  if (!IMAGE_TYPES.test(mime) || !data || !BASE64.test(data)) {
    return el('p', { class: 'content-note', text: `[image${mime ? ` ${mime}` : ''} not shown]` });
  }
  return el('figure', { class: 'content-image', testid: 'content-image' },
    el('img', { src: `data:${mime};base64,${data.replace(/\s+/g, '')}`, alt: `Image: ${label}`, loading: 'lazy' }),
    block.uri ? el('figcaption', { class: 'muted small' }, uriView(block.uri, label)) : null);
}

function audio(block) {
  // CSP default-src 'self' leaves media-src without data:, so a data: URL would not play.
  const size = formatSize(Math.floor(str(block.data).replace(/\s+/g, '').length * 3 / 4));
  const about = [str(block.mimeType), size].filter(Boolean).join(', ');
  return el('p', { class: 'content-note', testid: 'content-audio',
    text: `🔈 Audio clip${about ? ` (${about})` : ''}: playback is not available in the web UI` });
}

function resourceLink(block) {
  const name = str(block.title) || str(block.name) || baseName(block.uri);
  const meta = [str(block.mimeType), formatSize(block.size)].filter(Boolean).join(' · ');
  return el('div', { class: 'content-link', testid: 'content-resource-link' },
    el('span', { class: 'content-icon', 'aria-hidden': 'true', text: '📎' }),
    uriView(str(block.uri), name),
    meta ? el('span', { class: 'muted small', text: ` ${meta}` }) : null,
    str(block.description) ? el('p', { class: 'muted small content-about', text: block.description }) : null);
}

function resource(block) {
  const res = block.resource && typeof block.resource === 'object' ? block.resource : {};
  const uri = str(res.uri);
  if (typeof res.text === 'string') {
    return el('details', { class: 'content-resource', testid: 'content-resource' },
      el('summary', {}, el('span', { class: 'content-icon', 'aria-hidden': 'true', text: '📄' }),
        el('code', { text: uri || 'embedded text' }),
        el('span', { class: 'muted small', text: ` ${formatSize(new Blob([res.text]).size)}` })),
      codeView(res.text, languageHint(uri, res.mimeType)));
  }
  const size = formatSize(Math.floor(str(res.blob).replace(/\s+/g, '').length * 3 / 4));
  const about = [str(res.mimeType), size].filter(Boolean).join(', ');
  return el('p', { class: 'content-note', testid: 'content-resource' },
    el('span', { class: 'content-icon', 'aria-hidden': 'true', text: '📦' }),
    el('code', { text: uri || 'embedded data' }), about ? ` (${about})` : '');
}

/** The DOM for a non-text content block; unknown types show as a short label. */
export function contentBlock(block) {
  switch (block?.type) {
    case 'image': return image(block);
    case 'audio': return audio(block);
    case 'resource_link': return resourceLink(block);
    case 'resource': return resource(block);
    default: return el('p', { class: 'content-note', text: `[${str(block?.type) || 'content'}]` });
  }
}
