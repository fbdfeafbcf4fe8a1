// The ACP WebSocket of the web UI: JSON-RPC plumbing, `initialize`, reconnecting with backoff
// (and catching up: the app's onReady hook loads the current session after its last seq).

export class RpcError extends Error {
  constructor(error = {}) {
    super(error.message || 'unknown error');
    this.code = error.code;
    this.data = error.data;
  }
}

/** session/new needs the user to sign in to the agent first; the sign-in card is on screen. */
export class AgentLoginNeeded extends Error {
  constructor() { super('the agent needs a login'); }
}

/** JSON-RPC "authentication required": the agent wants `authenticate` before sessions. */
export const AUTH_REQUIRED = -32000;

/** A request that was in flight when the socket dropped; the session catches up on reconnect. */
export class ConnectionLost extends Error {
  constructor() { super('connection lost'); }
}

const CLIENT_INIT = {
  protocolVersion: 1,
  clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
  clientInfo: { name: 'acp-gateway-web', version: '0.1' },
};

export class Connection {
  /** @param hooks {onStatus, onReady, onMessage, onDrop, onError, authOk} */
  constructor(hooks) {
    this.hooks = hooks;
    this.agent = null;
    this.info = null; // the last `initialize` result: authMethods, _meta.gateway.workspaceRoots
    this.ws = null;
    this.nextId = 1;
    this.pending = new Map(); // request id → {resolve, reject}
    this.waiters = []; // requests made before `initialize` completed
    this.ready = false;
    this.stopped = true;
    this.retry = 0;
    this.timer = null;
    this.generation = 0; // bumped by open/close so a stale reconnect timer does nothing
  }

  /** (Re)connects to the given agent, dropping any current socket. */
  open(agent) {
    this.close();
    this.agent = agent;
    this.stopped = false;
    this.retry = 0;
    this.#connect();
  }

  /** Closes on purpose: no reconnect. */
  close() {
    this.stopped = true;
    this.generation += 1;
    clearTimeout(this.timer);
    const ws = this.ws;
    if (ws) {
      this.ws = null;
      ws.close(1000);
      this.#dropped();
    }
    this.#status('disconnected');
  }

  /** Skips the remaining backoff (e.g. when the browser comes back online). */
  reconnectNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.timer);
    this.#connect();
  }

  async request(method, params) {
    if (!this.ready) await new Promise((resolve) => this.waiters.push(resolve));
    return this.#send(method, params);
  }

  notify(method, params) {
    if (this.ready) this.#write({ jsonrpc: '2.0', method, params });
  }

  respond(id, result) { this.#write({ jsonrpc: '2.0', id, result }); }

  respondError(id, code, message) { this.#write({ jsonrpc: '2.0', id, error: { code, message } }); }

  #write(message) {
    if (this.ws?.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }

  #send(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      if (!this.#write({ jsonrpc: '2.0', id, method, params })) {
        this.pending.delete(id);
        reject(new ConnectionLost());
      }
    });
  }

  #status(state) {
    if (this.state === state) return;
    this.state = state;
    this.hooks.onStatus(state);
  }

  #connect() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const query = this.agent ? `?agent=${encodeURIComponent(this.agent)}` : '';
    this.#status('connecting');
    let ws;
    try {
      ws = new WebSocket(`${scheme}://${location.host}/acp${query}`, ['acp']);
    } catch (err) {
      this.hooks.onError(err);
      this.#scheduleReconnect();
      return;
    }
    this.ws = ws;
    ws.onopen = () => this.#initialize(ws);
    ws.onmessage = (event) => {
      if (this.ws === ws && typeof event.data === 'string') this.#receive(event.data);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return; // closed on purpose, already handled
      this.ws = null;
      this.#dropped();
      this.#scheduleReconnect();
    };
  }

  async #initialize(ws) {
    try {
      const info = await this.#send('initialize', CLIENT_INIT);
      if (this.ws !== ws) return;
      this.info = info ?? {};
      this.retry = 0;
      this.ready = true;
      this.#status('connected');
      // onReady (session/load catch-up) is written before any queued request.
      this.hooks.onReady();
      const waiters = this.waiters;
      this.waiters = [];
      waiters.forEach((resume) => resume());
    } catch (err) {
      if (this.ws !== ws) return;
      if (!(err instanceof ConnectionLost)) this.hooks.onError(err);
      ws.close();
    }
  }

  #receive(text) {
    let msg;
    try { msg = JSON.parse(text); } catch { return; }
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return;
    if (typeof msg.method === 'string') {
      this.hooks.onMessage(msg);
      return;
    }
    const entry = this.pending.get(msg.id);
    if (entry) {
      this.pending.delete(msg.id);
      if (msg.error) entry.reject(new RpcError(msg.error));
      else entry.resolve(msg.result);
    } else if (msg.error) {
      this.hooks.onError(new RpcError(msg.error));
    }
  }

  #dropped() {
    this.ready = false;
    const pending = [...this.pending.values()];
    this.pending.clear();
    pending.forEach(({ reject }) => reject(new ConnectionLost()));
    this.hooks.onDrop();
  }

  async #scheduleReconnect() {
    if (this.stopped) return;
    const generation = this.generation;
    this.#status('disconnected');
    this.retry += 1;
    // A 401 on the upgrade is invisible to the WebSocket API: ask the HTTP side after repeated failures.
    if (this.retry >= 2 && !(await this.hooks.authOk())) return;
    if (this.stopped || this.ws || generation !== this.generation) return;
    const base = Math.min(15000, 500 * 2 ** (this.retry - 1));
    this.timer = setTimeout(() => this.#connect(), base * (0.75 + Math.random() * 0.5));
  }
}
