// Signing the current agent in from the app. An agent that needs its own login (claude, codex, …)
// answers -32000 to session/new or to a prompt and lists its auth methods in `initialize`;
// js/signin.js offers each as the agent describes it, and after a sign-in what failed is retried.
// The Sign in button beside the agent opens the same card at any time (with Sign out when the user
// has keys there), and a badge says whether the user is signed in, where that is known.

import { authState, methodsOf, showAuthState, signInCard } from './signin.js';

export class AgentLogin {
  /**
   * @param {{conn: object, container: HTMLElement, badge: HTMLElement, agents: () => object[],
   *          reloadAgents: () => Promise<unknown>, note: (text: string) => void,
   *          error: (err: Error) => void, focus: () => void}} hooks
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.card = null;
  }

  /** The current agent's auth methods (from `initialize`). */
  methods() {
    return methodsOf(this.hooks.conn.info);
  }

  close() {
    this.card?.remove();
    this.card = null;
  }

  /** What the agent tells the user while an `agent` method runs. */
  progress(params) {
    this.card?.progress?.(params);
  }

  /** The current agent's entry of /api/agents (this user's keys and completed login). */
  mine() {
    return this.hooks.agents().find((a) => a.name === this.hooks.conn.agent);
  }

  /** "signed in" / "not signed in" beside the Sign in button, where that is known. */
  async refresh() {
    const { conn } = this.hooks;
    const agent = conn.agent;
    const known = await authState(conn.info, this.mine(), () => conn.request('auth/status', {}));
    if (conn.agent === agent) showAuthState(this.hooks.badge, known);
  }

  /** Shows the card: `err` is what the agent answered (null when the user asked), `retry(note)`
   *  runs after a sign-in (what failed, again). */
  show(err, retry) {
    this.close();
    const { conn } = this.hooks;
    const mine = this.mine();
    const card = signInCard({
      agent: conn.agent,
      methods: this.methods(),
      error: err,
      keys: Array.isArray(mine?.keys) ? mine.keys : [],
      login: mine?.login ?? null,
      authenticate: (methodId) => conn.request('authenticate', { methodId }),
      onSignedIn: async (name) => {
        if (this.card === card) this.card = null;
        await this.hooks.reloadAgents();
        this.refresh();
        const note = `Signed in to the agent with ${name}.`;
        try {
          // `retry` says it where what it does would not wipe it (a new session clears the log).
          if (retry) await retry(note);
          else this.hooks.note(note);
          this.hooks.focus();
        } catch (e) {
          this.hooks.error(e);
        }
      },
      onSignedOut: async () => {
        if (this.card === card) this.card = null;
        await this.hooks.reloadAgents();
        this.refresh();
        this.hooks.note('Signed out of the agent.');
      },
    });
    this.card = card;
    this.hooks.container.prepend(card);
    card.querySelector('input, button')?.focus();
  }
}
