// The working-directory picker: a modal <dialog> over GET /api/fs/dirs (the folders under a path
// inside the user's workspace roots) and POST /api/fs/dirs (a new folder). The folder list is
// one tab stop: arrows move in it, Enter opens a folder, Backspace or Alt+↑ goes up. The session
// controls (static/js/controls.js) open it from the cwd field and take the folder chosen.

import { el as h, str } from './dom.js';

/** Joins a directory and a child name as the gateway's paths are written (absolute, `/`). */
const joinPath = (dir, name) => `${dir.replace(/\/+$/, '')}/${name}`;

export class CwdPicker {
  constructor({ api, defaultCwd, roots, onChoose }) {
    this.api = api;
    this.defaultCwd = defaultCwd;
    this.rootsOf = roots;
    this.onChoose = onChoose;
    this.dialog = null;
    this.listing = null; // the last GET answer shown
    this.token = 0; // discards answers to superseded listings
  }

  #build() {
    const title = h('h2', { id: 'cwd-dialog-title', text: 'Choose a working directory' });
    this.rootsField = h('label', { class: 'field cwd-roots', hidden: true }, h('span', { text: 'Workspace root' }),
      this.roots = h('select', { testid: 'cwd-roots', onchange: () => this.go(this.roots.value) }));
    this.crumbs = h('ol', { class: 'cwd-crumbs' });
    this.entries = h('ul', { class: 'cwd-entries', testid: 'cwd-entries', 'aria-labelledby': 'cwd-dialog-title', onkeydown: (e) => this.#listKey(e) });
    this.note = h('p', { class: 'muted small cwd-note', testid: 'cwd-note', role: 'status' });
    this.error = h('p', { class: 'cwd-error', role: 'alert', testid: 'cwd-error' });
    this.newName = h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', testid: 'cwd-new-name', required: true });
    this.newForm = h('form', { class: 'cwd-new', testid: 'cwd-new-form', hidden: true, onsubmit: (e) => { e.preventDefault(); this.#create(); } },
      h('label', { class: 'field' }, h('span', { text: 'New folder name' }), this.newName),
      h('button', { type: 'submit', class: 'primary', testid: 'cwd-create', text: 'Create' }),
      h('button', { type: 'button', text: 'Cancel', onclick: () => this.#toggleNew(false) }));
    this.chosen = h('p', { class: 'cwd-chosen small', testid: 'cwd-chosen' });
    this.newButton = h('button', { type: 'button', testid: 'cwd-new-folder', text: 'New folder', onclick: () => this.#toggleNew(true) });
    this.useButton = h('button', { type: 'button', class: 'primary', testid: 'cwd-use', text: 'Use this folder', onclick: () => this.#use() });
    this.dialog = h('dialog', { class: 'cwd-dialog', 'aria-labelledby': 'cwd-dialog-title', testid: 'cwd-dialog' },
      title, this.rootsField,
      h('nav', { 'aria-label': 'Folder path', class: 'cwd-path', testid: 'cwd-crumbs' }, this.crumbs),
      this.entries, this.note, this.newForm, this.error, this.chosen,
      h('div', { class: 'dialog-actions' }, this.newButton,
        h('button', { type: 'button', testid: 'cwd-cancel', text: 'Cancel', onclick: () => this.dialog.close() }),
        this.useButton));
    // A modal dialog has the keyboard: the page's shortcuts ("/", "?", Escape to stop) wait.
    this.dialog.addEventListener('keydown', (event) => event.stopPropagation());
    document.body.append(this.dialog);
  }

  /** Opens at `start` (the typed cwd), else at the user's first workspace root. */
  async open(start) {
    if (!this.dialog) this.#build();
    this.listing = null;
    this.error.textContent = '';
    this.#toggleNew(false);
    this.entries.replaceChildren();
    this.dialog.showModal();
    const fallback = this.defaultCwd();
    // A typed path outside the known roots is not even asked about (the answer would be a 403).
    const roots = this.rootsOf();
    const inside = (p) => !roots.length || roots.some((r) => p === r || p.startsWith(joinPath(r, '')));
    const first = start && start.startsWith('/') && inside(start) ? start : fallback;
    if (!(await this.go(first, { quiet: first !== fallback })) && first !== fallback) await this.go(fallback);
  }

  /** Lists `path`; true when it was shown. */
  async go(path, { quiet = false, focus = true } = {}) {
    const token = ++this.token;
    this.dialog.setAttribute('aria-busy', 'true');
    let listing;
    try {
      listing = await this.api(`/api/fs/dirs?${new URLSearchParams({ path })}`);
    } catch (err) {
      if (token === this.token && !quiet) this.error.textContent = `Cannot open ${path}: ${err.message}`;
      return false;
    } finally {
      if (token === this.token) this.dialog.removeAttribute('aria-busy');
    }
    if (token !== this.token || !listing || !str(listing.path)) return false;
    this.error.textContent = '';
    this.#show(listing);
    if (focus && this.dialog.open) (this.entries.querySelector('button') ?? this.useButton).focus();
    return true;
  }

  #show(listing) {
    this.listing = listing;
    const roots = (Array.isArray(listing.roots) ? listing.roots : []).filter(str);
    const root = roots.filter((r) => listing.path === r || listing.path.startsWith(joinPath(r, ''))).sort((a, b) => b.length - a.length)[0] ?? '';
    this.rootsField.hidden = roots.length < 2;
    this.roots.replaceChildren(...roots.map((r) => h('option', { value: r, text: r })));
    this.roots.value = root;

    // Breadcrumbs from the root down: every one but the last opens that folder.
    const below = root ? listing.path.slice(root.length).split('/').filter(Boolean) : [];
    const crumbs = [{ name: root || listing.path, path: root || listing.path, title: root || listing.path }];
    below.forEach((name, i) => crumbs.push({ name, path: joinPath(root, below.slice(0, i + 1).join('/')) }));
    this.crumbs.replaceChildren(...crumbs.map((c, i) => h('li', {},
      i === crumbs.length - 1
        ? h('span', { 'aria-current': 'location', class: 'cwd-crumb-current', text: c.name, title: c.title ?? null })
        : h('button', { type: 'button', class: 'link cwd-crumb', testid: 'cwd-crumb', text: c.name, title: c.title ?? null, onclick: () => this.go(c.path) }))));

    const entries = (Array.isArray(listing.entries) ? listing.entries : []).filter((e) => e && str(e.name) && str(e.path));
    const items = [];
    if (str(listing.parent)) {
      items.push(h('li', {}, h('button', { type: 'button', class: 'cwd-entry cwd-up', testid: 'cwd-up', tabindex: '-1',
        onclick: () => this.go(listing.parent) }, h('span', { class: 'cwd-icon', 'aria-hidden': 'true', text: '↰' }),
      h('span', { text: 'Up one level' }))));
    }
    entries.forEach((e) => items.push(h('li', {}, h('button', { type: 'button', class: 'cwd-entry', testid: 'cwd-entry', tabindex: '-1',
      'data-path': e.path, onclick: () => this.go(e.path) }, h('span', { class: 'cwd-icon', 'aria-hidden': 'true', text: '📁' }), h('span', { text: e.name })))));
    this.entries.replaceChildren(...items);
    this.entries.querySelector('button')?.setAttribute('tabindex', '0');
    this.note.textContent = listing.truncated ? `Only the first ${entries.length} folders are shown.`
      : entries.length ? '' : 'No folders here.';
    this.chosen.replaceChildren(h('span', { class: 'muted', text: 'Selected: ' }), h('bdi', { text: listing.path }));
  }

  /** Roving focus inside the folder list. */
  #listKey(event) {
    const buttons = [...this.entries.querySelectorAll('button')];
    const at = buttons.indexOf(document.activeElement);
    let next = -1;
    if (event.key === 'ArrowDown') next = Math.min(buttons.length - 1, at + 1);
    else if (event.key === 'ArrowUp' && !event.altKey) next = Math.max(0, at - 1);
    else if (event.key === 'Home') next = 0;
    else if (event.key === 'End') next = buttons.length - 1;
    else if ((event.key === 'Backspace' || (event.key === 'ArrowUp' && event.altKey)) && str(this.listing?.parent)) {
      event.preventDefault();
      this.go(this.listing.parent);
      return;
    } else return;
    event.preventDefault();
    if (next < 0) return;
    buttons.forEach((b, i) => b.setAttribute('tabindex', i === next ? '0' : '-1'));
    buttons[next].focus();
  }

  #toggleNew(show) {
    this.newForm.hidden = !show;
    this.newButton.hidden = show;
    if (show) {
      this.newName.value = '';
      this.newName.focus();
    }
  }

  async #create() {
    const name = this.newName.value.trim();
    const base = this.listing?.path;
    if (!base) return;
    if (!name || name === '.' || name === '..' || name.includes('/') || name.includes('\0')) {
      this.error.textContent = 'A folder name cannot be empty, “.” or “..”, or contain “/”.';
      this.newName.focus();
      return;
    }
    let made;
    try {
      made = await this.api('/api/fs/dirs', {
        method: 'POST', headers: { Accept: 'application/json', 'Content-Type': 'application/json' },
        body: JSON.stringify({ path: joinPath(base, name) }),
      });
    } catch (err) {
      this.error.textContent = `Cannot create “${name}”: ${err.message}`;
      this.newName.focus();
      return;
    }
    this.#toggleNew(false);
    await this.go(str(made?.path) || joinPath(base, name));
    this.note.textContent = `Created “${name}”.`;
    this.useButton.focus();
  }

  #use() {
    if (!this.listing) return;
    this.onChoose(this.listing.path);
    this.dialog.close();
  }
}
