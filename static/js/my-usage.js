// What this user's agents cost this month (GET /api/usage), under their name in the sidebar.

import { api } from './http.js';

/** "This month: 1.23 USD" in `node`, when the user's agents report a cost (hidden otherwise). */
export async function showMyUsage(node) {
  let usage;
  try { usage = await api('/api/usage'); } catch { return; }
  const totals = new Map();
  for (const d of Array.isArray(usage?.days) ? usage.days : []) {
    if (typeof d?.cost === 'number' && typeof d?.currency === 'string') totals.set(d.currency, (totals.get(d.currency) ?? 0) + d.cost);
  }
  if (!totals.size) return;
  node.textContent = `This month: ${[...totals].map(([c, v]) => `${v.toFixed(2)} ${c}`).join(', ')}`;
  node.hidden = false;
}
