// The topbar's Download menu: the current session's stored transcript as Markdown (to read) or
// JSON Lines (every update, for programs), from GET /api/sessions/{id}/export. The browser
// downloads it with the page's own sign-in and names the file as the gateway says. The menu holds
// buttons, not links: the page keeps no same-origin links where agents' words are shown.

let current = null;

/** Points the menu at session `id` (hidden when there is none). */
export function showDownload(menu, id) {
  current = id ?? null;
  menu.hidden = !id;
  menu.open = false;
}

/** Downloads in the picked format; closes the menu then, or on a click elsewhere. */
export function wireDownload(menu) {
  menu.addEventListener('click', (e) => {
    const button = e.target.closest('button[data-format]');
    if (!button || !current) return;
    menu.open = false;
    const a = document.createElement('a');
    a.href = `/api/sessions/${encodeURIComponent(current)}/export?format=${button.dataset.format}`;
    a.download = '';
    document.body.append(a);
    a.click();
    a.remove();
  });
  document.addEventListener('click', (e) => { if (menu.open && !menu.contains(e.target)) menu.open = false; });
}
