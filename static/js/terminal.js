// Terminal output in a tool card: ANSI text through anser, as text nodes and spans coloured
// through the CSSOM (never innerHTML, never a style="..." string: the page's CSP forbids them),
// carriage returns applied, other control sequences dropped; and output appended to a block
// already drawn (static/js/tools.js streams `_meta.terminal_output` into it).

import Anser from '../vendor/anser.js';
import { el as h, isString } from './dom.js';

/** Characters of terminal output kept (the tail: the end of a build log is what matters). */
export const TERMINAL_CHAR_CAP = 200_000;

const ESC = '\u001b';
// OSC (ESC ] … BEL or ESC \), other two-byte escapes, and CSI sequences other than SGR `m`:
// anser understands SGR only, and a stray cursor move must not show up as text.
const NON_SGR = new RegExp(`${ESC}\\][^\\u0007${ESC}]*(?:\\u0007|${ESC}\\\\)|${ESC}\\[[0-9;?]*[A-Za-ln-z@]|${ESC}[^\\[\\]]`, 'g');
const RGB = /^\s*(\d{1,3})\s*,\s*(\d{1,3})\s*,\s*(\d{1,3})\s*$/;
const DECORATIONS = new Set(['bold', 'dim', 'italic', 'underline', 'blink', 'hidden', 'strikethrough']);

/** The terminal block's background and text (tools.css --tc-term-bg / --tc-term-text, light theme: the lighter one). */
const TERM_BG = [13, 17, 23];
const TERM_TEXT = [230, 237, 243];

/** WCAG relative luminance of an [r, g, b]. */
function luminance(rgb) {
  const [r, g, b] = rgb.map((c) => {
    const v = c / 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

function contrast(a, b) {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/**
 * `fg` moved toward white (or black, on a light background) until it reads on `bg` at 4.5:1,
 * as terminals' "minimum contrast ratio" does: ANSI's dark red or blue on a dark terminal is
 * otherwise unreadable. Hues stay recognisable.
 */
function readableOn(fg, bg) {
  if (contrast(fg, bg) >= 4.5) return fg;
  const target = luminance(bg) < 0.2 ? 255 : 0;
  for (let step = 1; step <= 10; step += 1) {
    const mixed = fg.map((c) => Math.round(c + (target - c) * (step / 10)));
    if (contrast(mixed, bg) >= 4.5) return mixed;
  }
  return [target, target, target];
}

/** Text that carries ANSI escape sequences. */
export const hasAnsi = (text) => isString(text) && text.includes(`${ESC}[`);

/** Carriage returns redraw a line (progress bars): keep what the last redraw left. */
function applyCarriageReturns(text) {
  if (!text.includes('\r')) return text;
  return text.split('\n').map((line) => {
    const trimmed = line.endsWith('\r') ? line.slice(0, -1) : line;
    const i = trimmed.lastIndexOf('\r');
    return i < 0 ? trimmed : trimmed.slice(i + 1);
  }).join('\n');
}

/** claude-code-acp and others wrap command output in a Markdown fence; a terminal shows it bare. */
function stripFence(text) {
  const m = /^```[\w-]*\n([\s\S]*?)\n?```\s*$/.exec(text);
  return m ? m[1] : text;
}

/**
 * A terminal block: anser's JSON chunks as spans, colours set through the CSSOM. `clipped`:
 * characters the caller already dropped from the start of `text`.
 */
export function renderTerminal(text, { testid = 'terminal', clipped = 0 } = {}) {
  let source = stripFence(String(text ?? ''));
  if (source.length > TERMINAL_CHAR_CAP) {
    clipped += source.length - TERMINAL_CHAR_CAP;
    source = source.slice(-TERMINAL_CHAR_CAP);
  }
  // Focusable and named: it scrolls, and keyboard users must be able to scroll it.
  const pre = h('pre', { class: 'tc-terminal', testid, tabindex: '0', role: 'group', 'aria-label': 'Terminal output' });
  if (clipped) pre.append(h('span', { class: 'tc-clipped', text: `… ${clipped.toLocaleString()} earlier characters not shown\n` }));
  // The colour state at the end of the block, for appendTerminal; the last line, if open, in a
  // block of its own, which output appended later finishes (see appendTerminal).
  pre.anser = new Anser();
  source = applyCarriageReturns(source.replace(NON_SGR, ''));
  const open = source.lastIndexOf('\n') + 1;
  appendSpans(pre, pre.anser, source.slice(0, open));
  if (open < source.length) {
    pre.lastPart = h('span', { class: 'tc-term-part' });
    appendSpans(pre.lastPart, pre.anser, source.slice(open));
    pre.append(pre.lastPart);
  }
  return pre;
}

/** A whole escape sequence (SGR, another CSI, OSC or a two-byte escape) at the start of a text. */
const WHOLE_ESCAPE = new RegExp(`^${ESC}(?:\\[[0-9;?]*[@-~]|\\][^\\u0007${ESC}]*(?:\\u0007|${ESC}\\\\)|[^\\[\\]])`);

/**
 * Appends `more` to a block renderTerminal made of `before` (so that it now shows `before +
 * more`) and answers true, when that draws what renderTerminal(before + more) would: not when
 * a carriage return may rewrite a line, the text is a Markdown fence, or `before` ends inside an
 * escape sequence. Answers false otherwise, and the caller renders the block anew.
 */
export function appendTerminal(pre, before, more) {
  if (!pre?.anser || !isString(before) || !isString(more) || before.length + more.length > TERMINAL_CHAR_CAP) return false;
  if (more.includes('\r') || before.slice(before.lastIndexOf('\n') + 1).includes('\r')) return false;
  if ((before.length >= 3 ? before : before + more).startsWith('```')) return false;
  const esc = before.lastIndexOf(ESC);
  if (esc >= 0 && !WHOLE_ESCAPE.test(before.slice(esc, esc + 4096))) return false;
  // New lines go into a block of their own, so the browser lays out only them, not every line of
  // the block again (30 ms an update at 150 KB); a line left open is finished in its block.
  const text = more.replace(NON_SGR, '');
  const open = before.endsWith('\n') ? 0 : text.indexOf('\n') + 1 || text.length;
  if (open) appendSpans(pre.lastPart ?? pre, pre.anser, text.slice(0, open));
  if (open < text.length) {
    pre.lastPart = h('span', { class: 'tc-term-part' });
    appendSpans(pre.lastPart, pre.anser, text.slice(open));
    pre.append(pre.lastPart);
  }
  return true;
}

/**
 * `source`'s chunks as text nodes and coloured spans at the end of `parent`, starting in `anser`'s
 * colour state (anser leaves the text before a text's first escape unstyled: it gets that state
 * here) and leaving `anser` in the state at the end.
 */
function appendSpans(parent, anser, source) {
  let chunks;
  try {
    const at = source.indexOf(`${ESC}[`);
    const lead = at < 0 ? source : source.slice(0, at);
    chunks = lead ? [{ content: lead, fg: anser.fg, bg: anser.bg, decorations: [...anser.decorations] }] : [];
    if (at >= 0) chunks.push(...anser.ansiToJson(source.slice(at), { json: true, remove_empty: true }));
  } catch {
    chunks = [{ content: source.replace(/\u001b\[[0-9;]*m/g, '') }];
  }
  for (const chunk of chunks) {
    if (!isString(chunk.content) || !chunk.content) continue;
    const styled = chunk.fg || chunk.bg || chunk.decorations?.length;
    if (!styled) {
      parent.append(document.createTextNode(chunk.content));
      continue;
    }
    const span = h('span', { class: 'tc-ansi', text: chunk.content });
    const rgb = (m) => (m ? [m[1], m[2], m[3]].map((n) => Math.min(255, Number(n))) : null);
    const fg = rgb(RGB.exec(chunk.fg ?? ''));
    const bg = rgb(RGB.exec(chunk.bg ?? ''));
    if (fg || bg) {
      const shown = readableOn(fg ?? TERM_TEXT, bg ?? TERM_BG);
      if (fg || shown !== TERM_TEXT) span.style.color = `rgb(${shown.join(', ')})`;
    }
    if (bg) span.style.backgroundColor = `rgb(${bg.join(', ')})`;
    for (const decoration of chunk.decorations ?? []) {
      if (DECORATIONS.has(decoration)) span.classList.add(`ansi-${decoration}`);
    }
    parent.append(span);
  }
}
