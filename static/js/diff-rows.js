// A diff as the rows the tool cards draw, from jsdiff; shared by static/js/tool-diff.js (small
// diffs, on the page) and static/js/diff-worker.js (large ones, off the page's thread).

import Diff from '../vendor/diff.js';

/** Lines of context around each change in a hunk. */
const CONTEXT = 3;

/**
 * jsdiff's hunks as rows: {type: 'hunk'|'ctx'|'add'|'del'|'note', old, new, text}; `null` when
 * jsdiff gave up after `timeout` ms (its cost grows with the number of changed lines).
 */
export function diffRows(oldText, newText, timeout) {
  const patch = Diff.structuredPatch('a', 'b', oldText, newText, '', '', { context: CONTEXT, timeout });
  if (!patch) return null;
  const rows = [];
  for (const hunk of patch.hunks) {
    rows.push({ type: 'hunk', text: `@@ -${hunk.oldStart},${hunk.oldLines} +${hunk.newStart},${hunk.newLines} @@` });
    let oldNo = hunk.oldStart;
    let newNo = hunk.newStart;
    for (const line of hunk.lines) {
      const sign = line[0];
      const text = line.slice(1);
      if (sign === '+') rows.push({ type: 'add', new: newNo++, text });
      else if (sign === '-') rows.push({ type: 'del', old: oldNo++, text });
      else if (sign === '\\') rows.push({ type: 'note', text: line.slice(2) });
      else rows.push({ type: 'ctx', old: oldNo++, new: newNo++, text });
    }
  }
  markWords(rows);
  return rows;
}

/** Longest line, and most changed-line pairs per diff, that get word-level marks. */
const WORDS_MAX_LINE = 400;
const WORDS_MAX_PAIRS = 500;

/**
 * Within each run of removed lines followed by added lines, pairs them up (1st with 1st…) and,
 * when a pair is mostly alike, gives each side `marks`: [start, end) character ranges of the
 * words that changed, as GitHub and Zed show them.
 */
function markWords(rows) {
  let pairs = 0;
  for (let i = 0; i < rows.length && pairs < WORDS_MAX_PAIRS;) {
    if (rows[i].type !== 'del') {
      i += 1;
      continue;
    }
    const dels = [];
    const adds = [];
    while (rows[i]?.type === 'del') dels.push(rows[i++]);
    while (rows[i]?.type === 'add') adds.push(rows[i++]);
    for (let k = 0; k < Math.min(dels.length, adds.length) && pairs < WORDS_MAX_PAIRS; k += 1, pairs += 1) {
      const [a, b] = [dels[k].text, adds[k].text];
      if (a.length > WORDS_MAX_LINE || b.length > WORDS_MAX_LINE) continue;
      const parts = Diff.diffWordsWithSpace(a, b);
      const same = parts.filter((p) => !p.added && !p.removed).reduce((n, p) => n + p.value.trim().length, 0);
      if (same < 0.4 * Math.max(a.trim().length, b.trim().length)) continue; // a rewrite, not an edit
      const oldMarks = [];
      const newMarks = [];
      let x = 0;
      let y = 0;
      for (const part of parts) {
        const n = part.value.length;
        if (part.removed) oldMarks.push([x, (x += n)]);
        else if (part.added) newMarks.push([y, (y += n)]);
        else {
          x += n;
          y += n;
        }
      }
      if (oldMarks.length) dels[k].marks = oldMarks;
      if (newMarks.length) adds[k].marks = newMarks;
    }
  }
}

/** The whole file replaced: every old line removed, every new line added (when no exact diff came). */
export function replacementRows(oldText, newText) {
  const split = (text) => (text === '' ? [] : (text.endsWith('\n') ? text.slice(0, -1) : text).split('\n'));
  const oldLines = split(oldText);
  const newLines = split(newText);
  return [
    { type: 'hunk', text: `@@ -1,${oldLines.length} +1,${newLines.length} @@` },
    ...oldLines.map((text, i) => ({ type: 'del', old: i + 1, text })),
    ...newLines.map((text, i) => ({ type: 'add', new: i + 1, text })),
  ];
}
