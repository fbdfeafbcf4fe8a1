// What agents ask the user, as cards above the prompt box: permission requests
// (js/permission-card.js) and questions (elicitation, js/elicitation.js). One card per request id;
// answering, withdrawing ($/cancel_request) or losing the connection removes it. Each card asked
// while its session is not the open one names that session; a notification says it was asked.

import { notice, resolved } from './attention.js';
import { elicitationCard } from './elicitation.js';
import { permissionCard } from './permission-card.js';
import { sessionTitle } from './session-list.js';

export class Asks {
  /**
   * @param {HTMLElement} container where the cards go
   * @param {{respond: (id: unknown, result: object) => void, current: () => string | undefined,
   *          session: (id: string) => object | undefined, showTool: (sessionId: string, toolCall: object) => void}} hooks
   */
  constructor(container, hooks) {
    this.container = container;
    this.hooks = hooks;
    this.cards = new Map(); // String(request id) → card element
  }

  /** The card for request `key`, if it is on screen. */
  get(key) {
    return this.cards.get(key);
  }

  /** Removes request `key`'s card (answered, withdrawn). */
  drop(key) {
    this.cards.get(key)?.remove();
    this.cards.delete(key);
    resolved(key);
  }

  /** The connection dropped: its requests cannot be answered any more. */
  clear() {
    this.cards.forEach((card) => card.remove());
    this.cards.clear();
  }

  add(key, card) {
    this.cards.get(key)?.remove();
    this.cards.set(key, card);
    this.container.append(card);
  }

  title(sessionId) {
    return sessionTitle(this.hooks.session(sessionId));
  }

  /** The agent asks the user something; withdrawn like a permission card. */
  elicitation(requestId, params) {
    const key = String(requestId);
    const card = elicitationCard(params, (result) => this.hooks.respond(requestId, result), () => this.drop(key));
    this.add(key, card);
    card.querySelector('input, select, button')?.focus();
    notice({ sessionId: params.sessionId, kind: 'permission', key, title: 'The agent asks you something',
      body: `${typeof params.message === 'string' ? params.message : ''} — ${this.title(params.sessionId)}` });
  }

  permission(requestId, params) {
    const key = String(requestId);
    const toolCall = params.toolCall ?? {};
    // The request's toolCall is a tool_call_update (ACP): what it says about a card on screen shows there.
    this.hooks.showTool(params.sessionId, toolCall);
    const card = permissionCard(params, (outcome) => {
      this.hooks.respond(requestId, { outcome });
      this.drop(key);
    });
    this.add(key, card);
    this.label();
    const what = typeof toolCall.title === 'string' && toolCall.title ? toolCall.title : 'A tool call';
    notice({ sessionId: params.sessionId, kind: 'permission', key, title: 'Permission requested',
      body: `${what} — ${this.title(params.sessionId)}` });
  }

  /** Names the session of each card that is not about the open one. */
  label() {
    this.container.querySelectorAll('.permission-where').forEach((where) => {
      const id = where.dataset.sessionId;
      where.textContent = id !== (this.hooks.current() ?? '') ? ` (in “${this.title(id)}”)` : '';
    });
  }
}
