// Session controls: the working-directory picker, the agent's modes and config options (model,
// reasoning effort, …), its slash commands with completion in the prompt box, and usage (the
// context window and cost per session in the header, the change per turn under each reply).
//
// app.js owns the connection and the conversation and tells this module what happens:
//   loaded(id, result, opts)  a session/new|load|resume result (`modes`, `configOptions`)
//   observe(params)           every `session/update` of every session, in arrival order
//   render(update)            from Conversation.apply (the current session, replays included)
//   show(session)             the current session changed (the conversation was reset)
//   beginTurn(id) / endTurn(id, result)   a session/prompt of this tab starts / is answered
//
// Session state (mode, options, commands, usage) follows `observe`, which sees every update once
// in wire order: a `session/load` answer therefore lands after the updates it replayed, and an
// update already seen (by `_meta.gateway.seq`) is never applied twice when a session is loaded
// again. Per-turn lines belong to the conversation view and follow `render`, which runs once per
// update shown. Agent strings only ever reach the DOM as text.
//
// The folder picker behind the cwd field is js/cwd-picker.js; the completion of slash commands in
// the prompt box is js/slash.js.

import { atEnd, el as h, $, str } from './dom.js';
import { CwdPicker } from './cwd-picker.js';
import { SlashCompletion } from './slash.js';

const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);

// --- what the agent sends, checked (ACP v1 schema shapes) -----------------------------------

/** SessionModeState → {currentModeId, availableModes: [{id, name, description}]} or null. */
function cleanModes(modes) {
  if (!modes || typeof modes !== 'object' || !Array.isArray(modes.availableModes)) return null;
  const availableModes = modes.availableModes
    .filter((m) => m && str(m.id))
    .map((m) => ({ id: m.id, name: str(m.name) || m.id, description: str(m.description) }));
  if (!availableModes.length) return null;
  return { currentModeId: str(modes.currentModeId), availableModes };
}

/** One SessionConfigSelectOption. */
const cleanChoice = (o) => (o && str(o.value) ? { value: o.value, name: str(o.name) || o.value, description: str(o.description) } : null);

/**
 * SessionConfigOption[]: `select` options (flat, or grouped as {group, name, options}) and
 * `boolean` ones; other kinds are skipped, as the schema's own reader does.
 */
function cleanConfig(options) {
  if (!Array.isArray(options)) return [];
  const out = [];
  for (const o of options) {
    if (!o || !str(o.id)) continue;
    const base = { id: o.id, name: str(o.name) || o.id, description: str(o.description), category: str(o.category) };
    if (o.type === 'boolean' && typeof o.currentValue === 'boolean') {
      out.push({ ...base, type: 'boolean', currentValue: o.currentValue });
    } else if (o.type === 'select' && Array.isArray(o.options)) {
      const grouped = o.options.some((g) => g && Array.isArray(g.options));
      const groups = grouped
        ? o.options.filter((g) => g && Array.isArray(g.options))
          .map((g) => ({ name: str(g.name) || str(g.group), options: g.options.map(cleanChoice).filter(Boolean) }))
        : [{ name: '', options: o.options.map(cleanChoice).filter(Boolean) }];
      out.push({ ...base, type: 'select', currentValue: str(o.currentValue), groups });
    }
  }
  return out;
}

/** AvailableCommand[] → [{name, description, hint}] (a leading "/" in a name is dropped). */
function cleanCommands(commands) {
  if (!Array.isArray(commands)) return [];
  return commands
    .filter((c) => c && str(c.name))
    .map((c) => ({ name: c.name.replace(/^\//, ''), description: str(c.description), hint: str(c.input?.hint) }))
    .filter((c) => c.name && !/\s/.test(c.name));
}

/** UsageUpdate → {used, size, cost: {amount, currency} | null} or null. */
function cleanUsage(u) {
  const used = num(u?.used);
  const size = num(u?.size);
  // The schema's used and size are unsigned, size the window: anything else is no usage to show.
  if (used == null || size == null || used < 0 || size <= 0) return null;
  // A cost is an amount in an ISO 4217 currency (three letters); anything else is not shown.
  const amount = num(u.cost?.amount);
  const currency = /^[A-Za-z]{3}$/.test(str(u.cost?.currency)) ? u.cost.currency.toUpperCase() : null;
  return { used, size, cost: amount != null && currency ? { amount, currency } : null };
}

// --- formatting -----------------------------------------------------------------------------

const compactFormat = new Intl.NumberFormat(undefined, { notation: 'compact', maximumFractionDigits: 1 });
const compact = (n) => compactFormat.format(n);
const whole = (n) => Math.round(n).toLocaleString();

/** An amount in its currency (ISO 4217), or "12.5 credits" for other units. */
function money(amount, currency) {
  const digits = Math.abs(amount) < 1 ? 4 : 2;
  try {
    return new Intl.NumberFormat(undefined, { style: 'currency', currency, minimumFractionDigits: 2, maximumFractionDigits: digits })
      .format(amount);
  } catch {
    return `${amount.toLocaleString(undefined, { maximumFractionDigits: digits })} ${currency}`;
  }
}

const signed = (n, format) => (n > 0 ? `+${format(n)}` : n < 0 ? `−${format(-n)}` : format(0));

const UPDATE_KINDS = new Set(['current_mode_update', 'config_option_update', 'available_commands_update', 'usage_update']);

// ---------------------------------------------------------------------------------------------

export class Controls {
  /**
   * @param deps.request  (method, params) => Promise: an ACP request on the current connection
   * @param deps.api      (path, fetchOptions) => Promise: app.js's same-origin JSON fetch
   * @param deps.append   (node) => void: appends a block to the conversation
   * @param deps.flush    () => void: renders the conversation's queued updates now
   * @param deps.defaultCwd () => string: the user's first workspace root
   * @param deps.roots    () => string[]: the user's workspace roots (GET /api/me)
   */
  constructor(deps) {
    this.deps = deps;
    /**
     * sessionId → {modes, configOptions, commands, usage, seq (newest update applied), fresh
     * (just made by session/new)}: survives switching sessions.
     */
    this.sessions = new Map();
    /** The shown session: {id, cwd} or null. */
    this.current = null;
    this.view = this.#freshView(null);
    this.ui = {
      cwd: $('cwd-input'), browse: $('cwd-browse'), sessionCwd: $('session-cwd'), usage: $('session-usage'),
      controls: $('session-controls'), input: $('prompt-input'), list: $('slash-list'), composer: $('composer'),
    };
    this.picker = new CwdPicker({ api: deps.api, defaultCwd: deps.defaultCwd, roots: deps.roots ?? (() => []),
      onChoose: (path) => this.#chooseCwd(path) });
    this.ui.browse?.addEventListener('click', () => this.picker.open(this.ui.cwd.value.trim()));
    this.slash = new SlashCompletion(this.ui, () => this.#state(this.current?.id)?.commands ?? []);
    this.#renderAll();
  }

  // --- events from app.js --------------------------------------------------------------------

  /** A session/new (`fresh`), session/load or session/resume result for session `id`. */
  loaded(id, result, { fresh = false, running = false } = {}) {
    if (!id) return;
    const s = this.#state(id, true);
    if (result && typeof result === 'object') {
      // A load that does not mention them leaves what the replay brought; a new session has none.
      if (fresh || 'modes' in result) s.modes = cleanModes(result.modes);
      if (fresh || 'configOptions' in result) s.configOptions = cleanConfig(result.configOptions);
    }
    s.fresh = fresh; // a new session has no history to replay: its view is loaded when shown
    if (id === this.current?.id) {
      this.#renderControls();
      if (!fresh) {
        // Every replayed update is in the conversation's queue by now: the last replayed turn
        // gets its usage line, unless this tab's own prompt is still running (endTurn does it).
        this.deps.flush();
        this.view.loaded = true;
        if (!running) this.#closeTurn();
      }
    }
  }

  /** Every `session/update` (all sessions, live and replayed), before the conversation sees it. */
  observe(params) {
    const update = params?.update;
    if (!update || !UPDATE_KINDS.has(update.sessionUpdate) || !str(params.sessionId)) return;
    const s = this.#state(params.sessionId, true);
    const seq = params._meta?.gateway?.seq;
    if (typeof seq === 'number') {
      if (seq <= s.seq) return; // seen before: this is a replay of it
      s.seq = seq;
    }
    const shown = params.sessionId === this.current?.id;
    switch (update.sessionUpdate) {
      case 'current_mode_update':
        if (s.modes && str(update.currentModeId)) s.modes.currentModeId = update.currentModeId;
        if (shown) this.#renderControls();
        break;
      case 'config_option_update':
        s.configOptions = cleanConfig(update.configOptions);
        if (shown) this.#renderControls();
        break;
      case 'available_commands_update':
        s.commands = cleanCommands(update.availableCommands);
        if (shown) this.slash.refresh();
        break;
      case 'usage_update': {
        const usage = cleanUsage(update);
        if (usage) s.usage = usage;
        if (shown) this.#renderUsage();
        break;
      }
      default:
    }
  }

  /**
   * Called by Conversation.apply for each update it shows, in order. Returns true for the
   * updates this module owns (the conversation shows nothing for them).
   */
  render(update) {
    const kind = update?.sessionUpdate;
    const view = this.view;
    if (kind === 'user_message_chunk') {
      // A user message starts a turn (its chunks are one message; this tab's own prompt started
      // its turn already in beginTurn, and its echo is not a new one).
      if (view.prev !== kind && !view.live) {
        this.#closeTurn();
        view.turn = { start: view.last, usage: null, promptUsage: null, line: null };
      }
      view.prev = kind;
      return false;
    }
    if (kind === 'usage_update') {
      const usage = cleanUsage(update);
      if (usage) {
        view.last = usage;
        if (view.turn) {
          view.turn.usage = usage;
          if (view.turn.line) this.#fillTurnLine(view.turn);
          else if (view.loaded && !view.live) this.#closeTurn(); // a turn another tab runs
        }
      }
      return true;
    }
    if (kind) view.prev = kind;
    return UPDATE_KINDS.has(kind);
  }

  /** The current session changed (app.js setCurrent): `session` is {id, cwd} or null. */
  show(session) {
    this.current = session?.id ? { id: session.id, cwd: str(session.cwd) } : null;
    this.view = this.#freshView(this.current?.id ?? null);
    const s = this.#state(this.current?.id);
    if (s?.fresh) {
      this.view.loaded = true;
      s.fresh = false; // shown again later, it is loaded (and replayed) like any other
    }
    this.#renderAll();
  }

  /** This tab sends a prompt in session `id`. */
  beginTurn(id) {
    if (id !== this.view.sessionId) return;
    this.#closeTurn();
    this.view.turn = { start: this.view.last, usage: null, promptUsage: null, line: null };
    this.view.live = true;
    this.view.prev = 'user_message_chunk';
  }

  /** This tab's prompt in session `id` was answered (`result` is the PromptResponse, or null). */
  endTurn(id, result) {
    if (id !== this.view.sessionId) return;
    this.deps.flush();
    const usage = result?.usage;
    if (this.view.turn && usage && typeof usage === 'object') this.view.turn.promptUsage = usage;
    this.view.live = false;
    this.#closeTurn();
  }

  /** A deleted session. */
  forget(id) {
    this.sessions.delete(id);
  }

  // --- state ---------------------------------------------------------------------------------

  #state(id, create = false) {
    if (!id) return null;
    let s = this.sessions.get(id);
    if (!s && create) this.sessions.set(id, (s = { modes: null, configOptions: [], commands: [], usage: null, seq: 0, fresh: false }));
    return s ?? null;
  }

  #freshView(sessionId) {
    // last: the newest usage shown; turn: the turn being shown; prev: the previous update's kind;
    // live: this tab's prompt is running; loaded: the session/load answer came.
    return { sessionId, last: null, turn: null, prev: '', live: false, loaded: false };
  }

  #chooseCwd(path) {
    this.ui.cwd.value = path;
    this.ui.cwd.dispatchEvent(new Event('input', { bubbles: true }));
    this.ui.cwd.dispatchEvent(new Event('change', { bubbles: true }));
  }

  // --- rendering -----------------------------------------------------------------------------

  #renderAll() {
    const cwd = this.current?.cwd ?? '';
    const label = this.ui.sessionCwd;
    if (label) {
      label.hidden = !cwd;
      label.title = cwd ? `Working directory: ${cwd}` : '';
      label.replaceChildren(h('span', { class: 'visually-hidden', text: 'Working directory: ' }), h('bdi', { text: cwd }));
    }
    this.slash.close();
    this.#renderControls();
    this.#renderUsage();
  }

  #renderUsage() {
    const box = this.ui.usage;
    if (!box) return;
    const usage = this.#state(this.current?.id)?.usage;
    box.hidden = !usage;
    if (!usage) return box.replaceChildren();
    const share = usage.size > 0 ? Math.min(1, usage.used / usage.size) : 0;
    const exact = `${whole(usage.used)} of ${whole(usage.size)} tokens in context (${Math.round(share * 100)}%)`;
    const meter = h('meter', { class: 'usage-meter', min: '0', max: '1', low: '0.7', high: '0.9', optimum: '0',
      value: String(share), 'aria-label': 'Context window used', title: exact });
    box.title = exact;
    box.replaceChildren(meter,
      h('span', { class: 'usage-context', testid: 'usage-context', text: `${compact(usage.used)} / ${compact(usage.size)}` }),
      usage.cost ? h('span', { class: 'usage-cost', testid: 'usage-cost', title: 'Session cost so far', text: money(usage.cost.amount, usage.cost.currency) }) : null);
  }

  /** The mode select and one control per config option, updated in place (focus stays put). */
  #renderControls() {
    const row = this.ui.controls;
    if (!row) return;
    const id = this.current?.id;
    const s = this.#state(id);
    const wanted = [];
    const config = [...(s?.configOptions ?? [])].sort((a, b) => (b.category === 'model') - (a.category === 'model'));
    // An agent that offers its modes as a config option as well wants clients to use the option.
    if (s?.modes && !config.some((o) => o.category === 'mode')) wanted.push({ key: 'mode', mode: s.modes });
    for (const option of config) wanted.push({ key: `config:${option.id}`, option });

    const existing = new Map([...row.querySelectorAll(':scope > .control')].map((el) => [el.dataset.key, el]));
    const nodes = wanted.map((w) => {
      const el = existing.get(w.key) ?? this.#makeControl(w);
      existing.delete(w.key);
      if (w.mode) this.#fillMode(el, w.mode);
      else this.#fillOption(el, w.option);
      return el;
    });
    existing.forEach((el) => el.remove());
    const error = row.querySelector(':scope > .control-error') ?? h('p', { class: 'control-error', role: 'alert', testid: 'control-error' });
    if (error.dataset.session !== id) error.textContent = '';
    error.dataset.session = id ?? '';
    // Only what moved is moved: moving a focused select would drop its focus.
    [...nodes, error].forEach((node, i) => {
      if (row.children[i] !== node) row.insertBefore(node, row.children[i] ?? null);
    });
    row.hidden = !nodes.length && !error.textContent;
  }

  #makeControl(w) {
    const field = w.mode
      ? h('select', { testid: 'mode-select', onchange: (e) => this.#setMode(e.target) })
      : w.option.type === 'boolean'
        ? h('input', { type: 'checkbox', testid: 'config-toggle', onchange: (e) => this.#setOption(e.target) })
        : h('select', { testid: 'config-select', onchange: (e) => this.#setOption(e.target) });
    return h('label', { class: `control${w.option?.type === 'boolean' ? ' control-toggle' : ''}`, 'data-key': w.key },
      h('span', { class: 'control-name' }), field);
  }

  #fillMode(el, modes) {
    const select = el.querySelector('select');
    el.querySelector('.control-name').textContent = 'Mode';
    const signature = JSON.stringify(modes.availableModes);
    if (select.dataset.signature !== signature) {
      select.dataset.signature = signature;
      select.replaceChildren(...modes.availableModes.map((m) => h('option', { value: m.id, text: m.name, title: m.description || null })));
    }
    select.value = modes.currentModeId;
    const current = modes.availableModes.find((m) => m.id === modes.currentModeId);
    el.title = current?.description ?? '';
  }

  #fillOption(el, option) {
    el.dataset.configId = option.id;
    el.dataset.category = option.category;
    el.querySelector('.control-name').textContent = option.category === 'model' ? 'Model' : option.name;
    el.title = option.description;
    const field = el.querySelector('select, input');
    field.dataset.configId = option.id;
    if (option.type === 'boolean') {
      field.checked = option.currentValue;
      return;
    }
    const signature = JSON.stringify(option.groups);
    if (field.dataset.signature !== signature) {
      field.dataset.signature = signature;
      const choice = (c) => h('option', { value: c.value, text: c.name, title: c.description || null });
      field.replaceChildren(...option.groups.map((g) => (g.name
        ? h('optgroup', { label: g.name }, g.options.map(choice))
        : g.options.map(choice))).flat());
    }
    field.value = option.currentValue;
  }

  #showError(text) {
    const error = this.ui.controls?.querySelector('.control-error');
    if (!error) return;
    error.textContent = text;
    this.ui.controls.hidden = false;
  }

  async #setMode(select) {
    const id = this.current?.id;
    const s = this.#state(id);
    if (!s?.modes) return;
    const before = s.modes.currentModeId;
    const modeId = select.value;
    if (modeId === before) return;
    s.modes.currentModeId = modeId;
    this.#showError('');
    select.setAttribute('aria-busy', 'true');
    try {
      await this.deps.request('session/set_mode', { sessionId: id, modeId });
    } catch (err) {
      if (s.modes?.currentModeId === modeId) s.modes.currentModeId = before;
      delete select.dataset.signature; // rebuilt from what the agent offers
      if (id === this.current?.id) this.#showError(`Could not switch the mode: ${err.message}`);
    } finally {
      select.removeAttribute('aria-busy');
      if (id === this.current?.id) this.#renderControls();
    }
  }

  async #setOption(field) {
    const id = this.current?.id;
    const s = this.#state(id);
    const option = s?.configOptions.find((o) => o.id === field.dataset.configId);
    if (!option) return;
    const before = option.currentValue;
    const value = option.type === 'boolean' ? field.checked : field.value;
    if (value === before) return;
    option.currentValue = value;
    this.#showError('');
    field.setAttribute('aria-busy', 'true');
    const params = { sessionId: id, configId: option.id, value };
    if (option.type === 'boolean') params.type = 'boolean';
    try {
      const result = await this.deps.request('session/set_config_option', params);
      if (Array.isArray(result?.configOptions)) s.configOptions = cleanConfig(result.configOptions);
    } catch (err) {
      // Revert, unless an update from the agent set something else meanwhile.
      const now = s.configOptions.find((o) => o.id === option.id);
      if (now && now.currentValue === value) now.currentValue = before;
      delete field.dataset.signature; // rebuilt from what the agent offers
      const label = option.category === 'model' ? 'the model' : `“${option.name}”`;
      if (id === this.current?.id) this.#showError(`Could not change ${label}: ${err.message}`);
    } finally {
      field.removeAttribute('aria-busy');
      if (id === this.current?.id) this.#renderControls();
    }
  }

  // --- per-turn usage ------------------------------------------------------------------------

  /** Puts the open turn's usage line under its reply (once), if the turn reported any usage. */
  #closeTurn() {
    const turn = this.view.turn;
    if (!turn || turn.line || (!turn.usage && !turn.promptUsage)) return;
    turn.line = h('p', { class: 'turn-usage muted small', testid: 'turn-usage' });
    this.#fillTurnLine(turn);
    const log = $('log');
    const stick = atEnd(log);
    this.deps.append(turn.line);
    if (stick) log.scrollTop = log.scrollHeight; // the reader was following the turn: keep following
  }

  #fillTurnLine(turn) {
    const parts = [];
    const { start, usage, promptUsage } = turn;
    if (usage) {
      const delta = usage.used - (start?.used ?? 0);
      parts.push(`context ${signed(delta, compact)} tokens (${compact(usage.used)} of ${compact(usage.size)})`);
      const cost = usage.cost;
      if (cost) {
        const before = start?.cost?.currency === cost.currency ? start.cost.amount : 0;
        parts.push(`cost ${money(cost.amount - before, cost.currency)}`);
      }
    }
    const total = num(promptUsage?.totalTokens);
    if (total != null) {
      const detail = [['inputTokens', 'in'], ['outputTokens', 'out'], ['thoughtTokens', 'thought'],
        ['cachedReadTokens', 'cache read'], ['cachedWriteTokens', 'cache write']]
        .filter(([key]) => num(promptUsage[key]) != null)
        .map(([key, label]) => `${whole(promptUsage[key])} ${label}`);
      parts.push(`${whole(total)} tokens${detail.length ? ` (${detail.join(', ')})` : ''}`);
    }
    turn.line.textContent = `This turn: ${parts.join(' · ')}`;
  }
}
