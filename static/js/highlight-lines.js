// Code highlighted line by line, for the diffs (static/js/tool-diff.js) and the file viewer
// (static/js/file-viewer.js): highlight.js output rebuilt as DOM, a line at a time, so a row of a
// diff or of the viewer can take the nodes of its own line.

import hljs from '../vendor/highlight.js';
import { el as h, isString } from './dom.js';

/** Texts longer than this are shown without syntax highlighting. */
const HIGHLIGHT_CHAR_CAP = 400_000;

/** highlight.js language for a file name, or null (no guessing: auto-detection is slow and wrong often). */
export function languageFor(path) {
  if (!isString(path)) return null;
  const name = path.split('/').pop().toLowerCase();
  if (name === 'makefile' || name === 'gnumakefile') return 'makefile';
  if (name === 'dockerfile') return hljs.getLanguage('dockerfile') ? 'dockerfile' : 'bash';
  const dot = name.lastIndexOf('.');
  if (dot < 0) return null;
  return canonicalLanguage(name.slice(dot + 1));
}

let languageNames = null; // alias or name → highlight.js's own name ('rs' → 'rust')

function canonicalLanguage(alias) {
  if (!languageNames) {
    languageNames = new Map();
    for (const name of hljs.listLanguages()) {
      languageNames.set(name, name);
      for (const other of hljs.getLanguage(name)?.aliases ?? []) languageNames.set(other, name);
    }
  }
  return languageNames.get(alias) ?? null;
}

const SAFE_CLASS = /^[A-Za-z0-9_ -]{1,80}$/;

/**
 * `text` split into lines, each an array of DOM nodes (text nodes, in hljs-classed spans when
 * `lang` is known). highlight.js escapes what it emits; the HTML is still parsed in an inert
 * document and rebuilt from spans and text only, so nothing else can reach the page.
 */
export function highlightLines(text, lang) {
  const plain = () => text.split('\n').map((line) => (line ? [document.createTextNode(line)] : []));
  if (!lang || text.length > HIGHLIGHT_CHAR_CAP) return plain();
  let html;
  try {
    html = hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
  } catch {
    return plain();
  }
  // A <div>, not a <pre>: the HTML parser drops a newline right after <pre>, which would lose an
  // empty first line and shift every line number.
  const doc = new DOMParser().parseFromString(`<div>${html}</div>`, 'text/html');
  const lines = [[]];
  const walk = (parent, wrap) => {
    for (const child of parent.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        child.data.split('\n').forEach((part, i) => {
          if (i > 0) lines.push([]);
          if (part) lines[lines.length - 1].push(wrap(document.createTextNode(part)));
        });
      } else if (child.nodeType === Node.ELEMENT_NODE) {
        const cls = child.getAttribute('class') ?? '';
        const safe = child.localName === 'span' && SAFE_CLASS.test(cls) ? cls : '';
        walk(child, safe ? (node) => wrap(h('span', { class: safe }, node)) : wrap);
      }
    }
  };
  walk(doc.querySelector('div') ?? doc.body, (node) => node);
  return lines;
}
