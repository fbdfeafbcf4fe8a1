// The topbar's Download menu: the current session's stored transcript as Markdown (to read) or
// JSON Lines (every update, for programs), from GET /api/sessions/{id}/export. Plain links: the
// browser downloads with the page's own sign-in and names the file as the gateway says.

/** Points the menu at session `id` (hidden when there is none). */
export function showDownload(menu, id) {
  menu.hidden = !id;
  menu.open = false;
  if (!id) return;
  menu.querySelectorAll('a[data-format]').forEach((a) => {
    a.href = `/api/sessions/${encodeURIComponent(id)}/export?format=${a.dataset.format}`;
  });
}

/** Closes the menu once a format is picked, or on a click elsewhere. */
export function wireDownload(menu) {
  menu.addEventListener('click', (e) => { if (e.target.closest('a')) menu.open = false; });
  document.addEventListener('click', (e) => { if (menu.open && !menu.contains(e.target)) menu.open = false; });
}
