// The sidebar's session list (GET /api/sessions, as `session/list` answers it): pages of 50,
// search, newest first, each with its relative time, its agent (when there are several), an
// Archive (or, in the archive view, Restore) and a Delete button. The app keeps the entries (`entries`: sessionId → {data, item}) for titles.

import { el as h } from './dom.js';
import { api, relativeTime } from './http.js';

/** A session's title as the list shows it. */
export function sessionTitle(data) {
  return data?.title?.trim() || 'Untitled session';
}

export class SessionList {
  /**
   * @param {{list: HTMLElement, empty: HTMLElement, loadMore: HTMLButtonElement, search: HTMLInputElement,
   *          archiveToggle: HTMLButtonElement}} ui
   * @param {{open: (id: string) => void, remove: (id: string) => void, current: () => string | undefined,
   *          badges: () => boolean, error: (err: Error) => void}} hooks
   */
  constructor(ui, hooks) {
    this.ui = ui;
    this.hooks = hooks;
    this.entries = new Map();
    this.cursor = null;
    this.archived = false; // listing the archived sessions
    this.token = 0; // discards answers to superseded list requests
    ui.archiveToggle.addEventListener('click', () => this.showArchived(!this.archived));
    let searchTimer;
    ui.search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => this.load(), 250);
    });
    ui.loadMore.addEventListener('click', () => this.load({ more: true }));
    setInterval(() => {
      ui.list.querySelectorAll('time[datetime]').forEach((t) => { t.textContent = relativeTime(t.dateTime); });
    }, 30000);
  }

  render(entry) {
    const { data } = entry;
    const time = h('time', { class: 'session-time muted small', datetime: data.updatedAt ?? '', text: relativeTime(data.updatedAt) });
    const agent = this.hooks.badges() && data._meta?.agent ? h('span', { class: 'badge small', text: data._meta.agent }) : null;
    const open = h('button', { type: 'button', class: 'session-open', onclick: () => this.hooks.open(data.sessionId) },
      h('span', { class: 'session-name', text: sessionTitle(data) }), h('span', { class: 'session-meta' }, time, agent));
    const remove = h('button', {
      type: 'button', class: 'icon session-delete', testid: 'session-delete',
      'aria-label': `Delete session ${sessionTitle(data)}`, title: 'Delete session', text: '×',
      onclick: () => this.hooks.remove(data.sessionId),
    });
    // Archived sessions are listed only in the archive view, each with Restore instead.
    const archived = Boolean(data._meta?.archivedAt);
    const archive = h('button', {
      type: 'button', class: 'icon session-archive', testid: archived ? 'session-restore' : 'session-archive',
      'aria-label': `${archived ? 'Restore' : 'Archive'} session ${sessionTitle(data)}`,
      title: archived ? 'Restore to the session list' : 'Archive (hide from the list)', text: archived ? '↥' : '↧',
      onclick: () => this.setArchived(data.sessionId, !archived),
    });
    const item = h('li', { class: 'session-item', testid: 'session-item', 'data-session-id': data.sessionId }, open, archive, remove);
    if (data.sessionId === this.hooks.current()) open.setAttribute('aria-current', 'true');
    entry.item?.replaceWith(item);
    entry.item = item;
    return item;
  }

  /** Adds or updates a session (`top`: moves it first); its entry. A session just made or
   *  prompted (`top`) that is not archived brings the list back from the archive view. */
  upsert(data, { top = false } = {}) {
    if (top && this.archived && !data._meta?.archivedAt) this.showArchived(false);
    let entry = this.entries.get(data.sessionId);
    if (entry) Object.assign(entry.data, data);
    else this.entries.set(data.sessionId, (entry = { data, item: null }));
    const item = this.render(entry);
    if (top) this.ui.list.prepend(item);
    else if (!item.isConnected) this.ui.list.append(item);
    this.ui.empty.hidden = this.entries.size > 0;
    return entry;
  }

  /** Loads the first page (or, `more`, the next one). */
  async load({ more = false } = {}) {
    const token = ++this.token;
    const params = new URLSearchParams({ limit: '50' });
    if (this.archived) params.set('archived', 'true');
    if (this.ui.search.value.trim()) params.set('search', this.ui.search.value.trim());
    if (more && this.cursor) params.set('cursor', this.cursor);
    this.ui.loadMore.disabled = true;
    try {
      const page = await api(`/api/sessions?${params}`);
      if (token !== this.token) return;
      if (!more) {
        this.entries.clear();
        this.ui.list.replaceChildren();
      }
      (page.sessions ?? []).forEach((s) => this.upsert(s));
      this.cursor = page.nextCursor ?? null;
      this.ui.loadMore.hidden = !this.cursor;
      this.ui.empty.hidden = this.entries.size > 0;
    } catch (err) {
      if (err.status !== 401) this.hooks.error(err);
    } finally {
      this.ui.loadMore.disabled = false;
    }
  }

  /** Switches between the sessions and the archived ones. */
  showArchived(on) {
    this.archived = on;
    this.ui.archiveToggle.textContent = on ? '← Back to sessions' : 'Archived sessions';
    this.ui.archiveToggle.setAttribute('aria-pressed', String(on));
    this.ui.empty.textContent = on ? 'No archived sessions.' : 'No sessions yet.';
    return this.load();
  }

  /** Archives or restores a session: it leaves the list shown now. */
  async setArchived(id, archived) {
    try {
      await api(`/api/sessions/${encodeURIComponent(id)}/archived`, { method: archived ? 'PUT' : 'DELETE' });
    } catch (err) {
      if (err.status !== 401) this.hooks.error(err);
      return;
    }
    this.drop(id);
  }

  /** Marks the open session's item. */
  markCurrent(id) {
    this.ui.list.querySelectorAll('.session-open').forEach((b) => b.removeAttribute('aria-current'));
    if (id) this.entries.get(id)?.item?.querySelector('.session-open').setAttribute('aria-current', 'true');
  }

  /** Drops a session from the list. */
  drop(id) {
    this.entries.get(id)?.item?.remove();
    this.entries.delete(id);
    this.ui.empty.hidden = this.entries.size > 0;
  }
}
