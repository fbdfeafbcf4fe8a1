// Slash-command completion in the prompt box, for the session controls (static/js/controls.js),
// which hand it the prompt's elements and a function that lists the current session's commands.
//
// Slash commands: "/" at the start of the prompt opens a list of the agent's commands. The prompt
// stays a textbox (a <textarea> may not take role=combobox) that owns a listbox through
// aria-controls / aria-activedescendant; arrows move, Enter or Tab accept, Escape closes.

import { el as h } from './dom.js';

export class SlashCompletion {
  constructor(ui, commands) {
    this.ui = ui;
    this.commands = commands;
    this.items = [];
    this.active = -1;
    this.dismissed = null; // the prompt text Escape closed the list on
    this.query = null; // the query the list shows matches for
    const { input, list, composer } = ui;
    if (!input || !list) return;
    input.setAttribute('aria-autocomplete', 'list');
    input.setAttribute('aria-haspopup', 'listbox');
    input.setAttribute('aria-controls', list.id);
    this.ghost = h('div', { class: 'slash-ghost', 'aria-hidden': 'true', testid: 'slash-hint', hidden: true });
    input.after(this.ghost);
    input.addEventListener('input', () => { this.refresh(); this.#hint(); });
    input.addEventListener('click', () => this.refresh());
    input.addEventListener('blur', () => this.close());
    input.addEventListener('scroll', () => this.#hint());
    // Capture on the form: it runs before app.js's Enter-to-send on the textarea itself.
    composer.addEventListener('keydown', (event) => this.#key(event), true);
    list.addEventListener('mousedown', (event) => event.preventDefault()); // keep focus in the prompt
    new ResizeObserver(() => this.#hint()).observe(input);
  }

  get open() { return !!this.ui.list && !this.ui.list.hidden; }

  /** The text typed after "/", when the caret is still inside the first word. */
  #query() {
    const { value, selectionStart, selectionEnd } = this.ui.input;
    if (!value.startsWith('/') || selectionStart !== selectionEnd || selectionStart < 1) return null;
    const typed = value.slice(1, selectionStart);
    if (/\s/.test(typed) || /\S/.test(value.slice(selectionStart, selectionStart + 1))) return null;
    return typed;
  }

  /** Opens, filters or closes the list for the prompt as it is now. */
  refresh() {
    const { input, list } = this.ui;
    if (!input || !list) return;
    const query = this.#query();
    if (input.value !== this.dismissed) this.dismissed = null;
    if (query == null || this.dismissed != null) return this.close();
    const q = query.toLowerCase();
    const all = this.commands();
    const matches = [
      ...all.filter((c) => c.name.toLowerCase().startsWith(q)),
      ...all.filter((c) => !c.name.toLowerCase().startsWith(q) && c.name.toLowerCase().includes(q)),
    ].slice(0, 50);
    if (!matches.length) return this.close();
    // Typing more puts the best match first and selects it; the same query keeps the selection.
    const keep = q === this.query ? this.items[this.active]?.name : null;
    this.query = q;
    this.items = matches;
    this.active = Math.max(0, matches.findIndex((c) => c.name === keep));
    list.replaceChildren(...matches.map((c, i) => h('li', {
      id: `slash-option-${i}`, role: 'option', class: 'slash-option', testid: 'slash-option', 'data-name': c.name,
      onclick: () => this.#accept(i),
      onmousemove: () => { if (this.active !== i) this.#move(i); },
    },
    h('span', { class: 'slash-name', text: `/${c.name}` }),
    c.description ? h('span', { class: 'slash-description', text: c.description }) : null,
    c.hint ? h('span', { class: 'slash-input', text: c.hint }) : null)));
    list.hidden = false;
    this.#move(this.active);
  }

  close() {
    const { input, list } = this.ui;
    if (!list || list.hidden) return;
    list.hidden = true;
    list.replaceChildren();
    this.query = null;
    this.items = [];
    this.active = -1;
    input.removeAttribute('aria-activedescendant');
  }

  #move(index) {
    const options = this.ui.list.children;
    if (!options.length) return;
    this.active = (index + options.length) % options.length;
    [...options].forEach((li, i) => li.setAttribute('aria-selected', String(i === this.active)));
    options[this.active].scrollIntoView({ block: 'nearest' });
    this.ui.input.setAttribute('aria-activedescendant', options[this.active].id);
  }

  #accept(index) {
    const command = this.items[index];
    if (!command) return;
    const { input } = this.ui;
    const rest = input.value.replace(/^\/\S*\s*/, '');
    const head = `/${command.name} `;
    input.value = head + rest;
    input.setSelectionRange(head.length, head.length);
    this.close();
    input.focus();
    input.dispatchEvent(new Event('input', { bubbles: true }));
  }

  #key(event) {
    if (event.target !== this.ui.input || event.isComposing) return;
    if (!this.open) {
      if ((event.key === 'ArrowDown' && event.altKey) || (event.key === ' ' && event.ctrlKey)) {
        this.dismissed = null;
        this.refresh();
        if (this.open) event.preventDefault();
      }
      return;
    }
    const stop = () => { event.preventDefault(); event.stopPropagation(); };
    switch (event.key) {
      case 'ArrowDown': stop(); this.#move(this.active + 1); break;
      case 'ArrowUp': stop(); this.#move(this.active - 1); break;
      case 'Home': case 'End':
        if (event.ctrlKey) { stop(); this.#move(event.key === 'Home' ? 0 : this.items.length - 1); }
        break;
      case 'Enter':
        if (event.shiftKey) break;
        stop(); this.#accept(this.active); break;
      case 'Tab':
        if (event.shiftKey) break;
        stop(); this.#accept(this.active); break;
      case 'Escape':
        stop(); this.dismissed = this.ui.input.value; this.close(); break;
      default:
    }
  }

  /**
   * The command's input hint, shown like a placeholder after "/name " while nothing follows it
   * (a real placeholder only shows in an empty box): a copy of the prompt's text in the same
   * font and padding, transparent except for the hint.
   */
  #hint() {
    const { input } = this.ui;
    const ghost = this.ghost;
    if (!ghost) return;
    const match = /^\/(\S+) $/.exec(input.value);
    const command = match && this.commands().find((c) => c.name === match[1]);
    if (!command?.hint || input.scrollTop > 0) {
      ghost.hidden = true;
      return;
    }
    const cs = getComputedStyle(input);
    for (const p of ['fontFamily', 'fontSize', 'lineHeight', 'letterSpacing', 'paddingTop', 'paddingLeft', 'paddingRight',
      'borderTopWidth', 'borderLeftWidth', 'borderRightWidth']) ghost.style[p] = cs[p];
    ghost.style.left = `${input.offsetLeft}px`;
    ghost.style.top = `${input.offsetTop}px`;
    ghost.style.width = `${input.offsetWidth}px`;
    ghost.replaceChildren(h('span', { class: 'slash-ghost-typed', text: input.value }), h('span', { text: command.hint }));
    ghost.hidden = false;
  }
}
