// The conversation view: renders `session/update`s (batched per animation frame, de-duplicated by
// seq) as messages (js/message.js), tool cards (js/tools.js) and the plan; the session controls'
// updates go to js/controls.js through the `render` hook.

import { ToolCard } from './tools.js';
import { Message } from './message.js';
import { atEnd, el as h, soon } from './dom.js';

const CHUNK_KINDS = {
  user_message_chunk: 'user',
  agent_message_chunk: 'agent',
  agent_thought_chunk: 'thought',
};
const SPEAKERS = { user: 'You', agent: 'Agent', thought: 'Agent (thinking)' };

export class Conversation {
  /** @param hooks {render(update) → whether js/controls.js took it, cwd() → the session's cwd} */
  constructor(log, hooks) {
    this.log = log;
    this.hooks = hooks;
    this.scheduled = false;
    this.reset(null);
  }

  /** Clears the view and starts rendering `sessionId` (or nothing). */
  reset(sessionId) {
    this.sessionId = sessionId;
    this.lastSeq = 0; // highest `_meta.gateway.seq` rendered; used for session/load afterSeq
    this.queue = [];
    this.run = null; // the message bubble that consecutive chunks of one kind append to
    this.tools = new Map(); // toolCallId → card parts
    this.plan = null;
    this.planTurn = -1;
    this.turn = 0; // user messages so far: a plan from an earlier turn is replaced, not updated in place
    this.echo = ''; // text of a prompt rendered locally, in case the gateway echoes it back
    this.echoBlocks = 0; // and how many of its attachments
    this.log.replaceChildren();
    this.busy(false);
  }

  /** Marks the log busy while a turn or a load runs; when it ends, the last message is over too. */
  busy(on) {
    this.log.setAttribute('aria-busy', String(on));
    if (!on) {
      this.flush();
      this.run?.finish(); // settles its text; a thought stops saying "Thinking…"
    }
  }

  /** Queues an update for the next frame; with no `params`, just asks for a frame (a slow message tail). */
  enqueue(params) {
    if (params) this.queue.push(params);
    if (this.scheduled) return;
    this.scheduled = true;
    soon(() => { if (this.scheduled) this.flush(); });
  }

  /** Applies every queued update in one DOM pass. */
  flush() {
    this.scheduled = false;
    const items = this.queue;
    this.queue = [];
    if (!items.length && !this.run?.dirty) return;
    const stick = atEnd(this.log);
    for (const params of items) {
      if (params.sessionId !== this.sessionId) continue;
      const seq = params._meta?.gateway?.seq;
      if (typeof seq === 'number') {
        if (seq <= this.lastSeq) continue; // already rendered (replay overlap after reconnect)
        this.lastSeq = seq;
      }
      try {
        this.apply(params.update ?? {});
        if (typeof seq === 'number' && this.run?.kind === 'agent') this.forkPoint(this.run, seq);
      } catch (err) {
        console.error('render failed', err, params);
        this.raw('unrenderable update', params.update);
      }
    }
    // The streaming message draws once per frame, however many chunks this frame brought. A
    // message that cannot be drawn ends there: the rest of the session still renders.
    let more = false;
    try {
      more = this.run?.render();
    } catch (err) {
      console.error('render failed', err);
      this.run = null;
    }
    if (more) this.enqueue(null);
    if (stick) this.log.scrollTop = this.log.scrollHeight;
  }

  apply(update) {
    if (this.hooks.render(update)) return undefined; // modes, options, commands, usage: js/controls.js
    const kind = CHUNK_KINDS[update.sessionUpdate];
    if (kind) return this.chunk(kind, update.content, update.messageId);
    switch (update.sessionUpdate) {
      case 'plan': return this.renderPlan(Array.isArray(update.entries) ? update.entries : []);
      case 'tool_call':
      case 'tool_call_update': return this.renderTool(update);
      case 'session_info_update': return undefined; // shown in the sidebar and header
      default: return this.raw(update.sessionUpdate || 'update', update);
    }
  }

  /** Gives an agent's message a "Fork from here" button, forking after its last update. */
  forkPoint(message, seq) {
    message.root.dataset.seq = String(seq);
    if (message.forkButton || !this.hooks.fork || this.hooks.canFork?.() === false) return;
    message.forkButton = h('button', {
      type: 'button', class: 'msg-fork', testid: 'fork-here', text: 'Fork from here',
      title: 'A new session with this conversation up to here',
      onclick: () => this.hooks.fork(Number(message.root.dataset.seq), this.lastSeq),
    });
    message.root.append(message.forkButton);
  }

  /** Appends a new block; it ends any run of merged chunks. */
  append(node) {
    this.run?.finish();
    this.run = null;
    this.log.append(node);
  }

  /** A message chunk: Markdown text, or another content block (static/js/message.js). */
  chunk(kind, content, messageId) {
    const block = typeof content === 'string' ? { type: 'text', text: content } : content;
    if (!block || typeof block !== 'object') return;
    const text = block.type === 'text' ? String(block.text ?? '') : null;
    if (kind === 'user' && this.echo && text != null) {
      if (this.echo.startsWith(text)) {
        this.echo = this.echo.slice(text.length);
        return;
      }
    }
    if (kind === 'user' && text == null && this.echoBlocks > 0) {
      this.echoBlocks -= 1;
      return;
    }
    this.echo = '';
    this.echoBlocks = 0;
    // A new `messageId` starts a new message even of the same kind (two prompts in a row, the
    // first refused by the agent).
    const id = typeof messageId === 'string' ? messageId : null;
    if (this.run?.kind !== kind || (id && this.run.messageId && id !== this.run.messageId)) {
      const message = new Message(kind, SPEAKERS[kind]);
      this.append(message.root);
      this.run = message;
      if (kind === 'user') this.turn += 1;
    }
    if (id) this.run.messageId = id;
    if (text != null) this.run.write(text);
    else this.run.block(block);
  }

  /** Renders the user's prompt at once (its text and attachments); the echoed
   *  user_message_chunks that carry them are skipped. */
  localPrompt(text, attached = []) {
    this.flush();
    this.run = null; // a prompt of its own, even right after another (one the agent refused)
    this.echo = ''; // an earlier prompt's echo that never came (the agent refused it) is not this one
    this.echoBlocks = 0;
    if (text) this.chunk('user', text);
    for (const block of attached) this.chunk('user', block);
    this.run.finish();
    this.echo = text;
    this.echoBlocks = attached.length;
    this.log.scrollTop = this.log.scrollHeight;
  }

  renderPlan(entries) {
    const list = h('ol', { class: 'plan-list' }, entries.filter((entry) => entry && typeof entry === 'object').map((entry) => {
      const box = h('input', {
        type: 'checkbox', disabled: true,
        checked: entry.status === 'completed', indeterminate: entry.status === 'in_progress',
      });
      return h('li', { class: 'plan-entry', 'data-status': entry.status, 'data-priority': entry.priority },
        h('label', {}, box, h('span', { text: entry.content ?? '' })));
    }));
    if (this.plan && this.planTurn === this.turn) {
      this.plan.querySelector('ol').replaceWith(list);
      return;
    }
    this.plan?.remove();
    this.plan = h('section', { class: 'plan', testid: 'plan', 'aria-label': 'Plan' },
      h('h3', { class: 'plan-head', text: 'Plan' }), list);
    this.planTurn = this.turn;
    this.append(this.plan);
  }

  /** Tool call cards (static/js/tools.js): a `tool_call` creates one, `tool_call_update`s merge into it. */
  renderTool(update) {
    let card = this.tools.get(update.toolCallId);
    if (!card) {
      card = new ToolCard(update.toolCallId, { cwd: this.hooks.cwd });
      this.tools.set(update.toolCallId, card);
      this.append(card.root);
    }
    card.apply(update);
  }

  raw(label, value) {
    this.append(h('details', { class: 'raw', testid: 'raw-update' },
      h('summary', { text: label }), h('pre', { text: JSON.stringify(value, null, 2) })));
  }

  note(text) {
    this.flush();
    this.append(h('p', { class: 'note', role: 'status', text }));
  }

  error(err) {
    this.flush();
    const text = err.code != null ? `${err.message} (code ${err.code})` : err.message;
    const last = this.log.lastElementChild;
    if (last?.dataset.testid === 'error-banner' && last.dataset.text === text) return; // repeated
    const banner = h('div', { class: 'banner error', role: 'alert', testid: 'error-banner', 'data-text': text },
      h('strong', { text: 'Error: ' }), h('span', { text }),
      h('button', { type: 'button', class: 'icon', 'aria-label': 'Dismiss error', text: '×', onclick: () => banner.remove() }));
    this.append(banner);
    this.log.scrollTop = this.log.scrollHeight;
  }
}
