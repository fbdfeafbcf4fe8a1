// A diff as the rows the tool cards draw, from jsdiff; shared by static/js/tools.js (small diffs,
// on the page) and static/js/diff-worker.js (large ones, off the page's thread).

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
  return rows;
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
