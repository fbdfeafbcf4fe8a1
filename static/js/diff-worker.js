// Computes large diffs for static/js/tool-diff.js off the page's thread (a module worker): jsdiff
// can take seconds on a rewritten file of a few thousand lines, and the conversation must not
// freeze.
// Message in: {id, oldText, newText}; out: {id, rows, exact} (exact false: a whole-file replacement,
// because even here the diff took longer than TIMEOUT_MS).

import { diffRows, replacementRows } from './diff-rows.js';

const TIMEOUT_MS = 10_000;

self.onmessage = ({ data }) => {
  const { id, oldText, newText } = data ?? {};
  if (typeof oldText !== 'string' || typeof newText !== 'string') return;
  const rows = diffRows(oldText, newText, TIMEOUT_MS);
  self.postMessage(rows ? { id, rows, exact: true } : { id, rows: replacementRows(oldText, newText), exact: false });
};
