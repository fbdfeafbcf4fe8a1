// The agent picker: the agents the gateway offers (/api/agents) in the header's select, the one
// last used on this device remembered.

import { el as h } from './dom.js';
import { api } from './http.js';

const SAVED = 'acp-gateway.agent';

/** An agent's option text: its name, and its own title when it says one. */
const label = (a) => {
  const title = a.agentInfo?.title || a.agentInfo?.name;
  return title ? `${a.name} (${title})` : a.name;
};

export class AgentPicker {
  /** @param {HTMLSelectElement} select @param {{error: (err: Error) => void}} hooks */
  constructor(select, hooks) {
    this.select = select;
    this.hooks = hooks;
    /** The agents offered, as /api/agents lists them. */
    this.agents = [];
  }

  /**
   * Lists the agents again and fills the select; returns the name of the one to use: the last
   * used on this device, else the gateway's default, else the first (null when there is none).
   */
  async load() {
    try {
      this.agents = (await api('/api/agents')).agents ?? [];
    } catch (err) {
      if (err.status !== 401) this.hooks.error(err);
      this.agents = [];
    }
    const saved = localStorage.getItem(SAVED);
    const chosen = this.agents.find((a) => a.name === saved) ?? this.agents.find((a) => a.default) ?? this.agents[0];
    this.select.replaceChildren(...this.agents.map((a) => h('option', { value: a.name, text: label(a) })));
    this.select.disabled = this.agents.length < 2;
    this.select.value = chosen?.name ?? '';
    return chosen?.name ?? null;
  }

  /** Shows `name` as chosen and remembers it on this device. */
  remember(name) {
    this.select.value = name;
    localStorage.setItem(SAVED, name);
  }
}
