// Messages typed while the agent works. The gateway keeps them, one queue per session
// (`_gateway/queue/add|edit|remove|send`), sends each when the turn before it ends, and tells
// every tab of the session what the queue holds (`_gateway/queue` notices). This module keeps
// the last notice of each session and shows the current session's queue above the prompt box:
// each message can be edited or removed until it is sent; after a stopped turn the queue waits
// for "Send next".

import { el as h } from './dom.js';

/** The text a queued prompt shows: its text blocks, and how many attachments it carries. */
function summary(prompt) {
  const blocks = Array.isArray(prompt) ? prompt : [];
  const text = blocks.filter((b) => b?.type === 'text' && typeof b.text === 'string').map((b) => b.text).join('\n');
  const others = blocks.filter((b) => b?.type !== 'text').length;
  return { text, others };
}

export class PromptQueue {
  /**
   * @param {HTMLElement} list the `<ol>` that shows the queue
   * @param {{request: (method: string, params: object) => Promise<any>, changed: (sessionId: string) => void,
   *          error: (err: Error) => void}} hooks
   */
  constructor(list, hooks) {
    this.list = list;
    this.hooks = hooks;
    this.states = new Map(); // sessionId → the last `_gateway/queue` params
    this.current = null;
    this.editing = null; // id of the message being edited
  }

  /** A `_gateway/queue` notice. */
  observe(params) {
    if (typeof params?.sessionId !== 'string') return;
    this.states.set(params.sessionId, params);
    if (params.sessionId === this.current) this.render();
    this.hooks.changed(params.sessionId);
  }

  /** Forgets what a session's queue held (a load says it again when there is anything to say). */
  forget(sessionId) {
    this.states.delete(sessionId);
    if (sessionId === this.current) this.render();
  }

  /** Shows this session's queue. */
  show(sessionId) {
    this.current = sessionId;
    this.editing = null;
    this.render();
  }

  /** Whether the gateway says a turn of this session runs (one this tab did not start, say). */
  running(sessionId) {
    return !!this.states.get(sessionId)?.running;
  }

  /** Queues `prompt` (ACP content blocks) for the session. */
  add(sessionId, prompt) {
    return this.hooks.request('_gateway/queue/add', { sessionId, prompt });
  }

  act(method, params) {
    this.hooks.request(method, { sessionId: this.current, ...params }).catch((err) => this.hooks.error(err));
  }

  render() {
    const state = this.states.get(this.current);
    const queue = Array.isArray(state?.queue) ? state.queue : [];
    this.list.replaceChildren();
    this.list.hidden = !queue.length && !state?.error;
    if (this.list.hidden) return;
    const held = !!state.held && !state.running;
    const head = h('li', { class: 'queued-head', testid: 'queued-head' },
      h('span', { text: held ? 'Paused after the last turn stopped' : `Queued: sent when the agent finishes` }));
    if (held && queue.length) {
      head.append(h('button', { type: 'button', class: 'queued-send', testid: 'queued-send', text: 'Send next',
        onclick: () => this.act('_gateway/queue/send', {}) }));
    }
    this.list.append(head);
    if (typeof state.error === 'string') {
      this.list.append(h('li', { class: 'queued-error', role: 'alert', text: `Not sent: ${state.error}` }));
    }
    for (const item of queue) this.list.append(this.item(item));
  }

  item({ id, prompt }) {
    const { text, others } = summary(prompt);
    const li = h('li', { class: 'queued', testid: 'queued', 'data-id': id });
    if (this.editing === id) {
      const box = h('textarea', { class: 'queued-edit', rows: 2, 'aria-label': 'Edit queued message', testid: 'queued-edit' });
      box.value = text;
      const save = () => {
        this.editing = null;
        const rest = (Array.isArray(prompt) ? prompt : []).filter((b) => b?.type !== 'text');
        const edited = [...(box.value.trim() ? [{ type: 'text', text: box.value.trim() }] : []), ...rest];
        if (!edited.length) return this.act('_gateway/queue/remove', { id });
        this.act('_gateway/queue/edit', { id, prompt: edited });
      };
      box.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) { event.preventDefault(); save(); }
        if (event.key === 'Escape') { event.stopPropagation(); this.editing = null; this.render(); }
      });
      li.append(box,
        h('button', { type: 'button', testid: 'queued-save', text: 'Save', onclick: save }),
        h('button', { type: 'button', text: 'Cancel', onclick: () => { this.editing = null; this.render(); } }));
      queueMicrotask(() => box.focus());
      return li;
    }
    li.append(h('span', { class: 'queued-text', text: text || '(attachments only)' }));
    if (others) li.append(h('span', { class: 'queued-more', text: `+${others} attached` }));
    li.append(
      h('button', { type: 'button', class: 'queued-action', testid: 'queued-edit-button', text: 'Edit',
        'aria-label': `Edit queued message: ${text.slice(0, 40)}`, onclick: () => { this.editing = id; this.render(); } }),
      h('button', { type: 'button', class: 'queued-action queued-remove', testid: 'queued-remove', text: '×',
        'aria-label': `Remove queued message: ${text.slice(0, 40)}`, onclick: () => this.act('_gateway/queue/remove', { id }) }),
    );
    return li;
  }
}
