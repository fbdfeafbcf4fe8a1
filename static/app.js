// acp-gateway web UI: plain ES module, no framework, no build step.
//
// This file holds the app's state and wires its parts: the sidebar, the session list, prompts and
// the agent's requests. The ACP WebSocket is js/connection.js, the conversation view
// js/conversation.js, what agents ask js/asks.js, REST calls js/http.js, the sign-in page
// js/signin-page.js.
//
// All agent-provided text reaches the DOM through textContent / text nodes, never innerHTML, except
// message Markdown, which goes through static/js/markdown.js (marked, then DOMPurify's allow-list).

import { askForNotifications, initAttention, notice, setBaseTitle } from './js/attention.js';
import { closeSidebar, initLayout } from './js/layout.js';
import { installShortcuts } from './js/shortcuts.js';
import { initTabs, shareDeleted, shareSession } from './js/tabs.js';

import { Controls } from './js/controls.js';
import { el as h, $ } from './js/dom.js';
import { AUTH_REQUIRED, AgentLoginNeeded, Connection, ConnectionLost, RpcError } from './js/connection.js';
import { Conversation } from './js/conversation.js';
import { AgentLogin } from './js/agent-login.js';
import { AgentPicker } from './js/agent-picker.js';
import { Attachments } from './js/attachments.js';
import { PromptQueue } from './js/queue.js';
import { renderPush } from './js/push.js';
import { renderDevices } from './js/devices.js';
import { showMyUsage } from './js/my-usage.js';
import { api, onUnauthorized } from './js/http.js';
import { SessionList, sessionTitle } from './js/session-list.js';
import { onLeave, showSignIn } from './js/signin-page.js';
import { Asks } from './js/asks.js';
import { showDownload, wireDownload } from './js/download.js';
import { forkSession } from './js/fork.js';
import { loadSharedWithMe, openShareDialog, openShareLink, takeShareToken } from './js/sharing.js';

// ---------------------------------------------------------------------------------------------

const ui = {
  app: $('app'), signin: $('signin'), log: $('log'), permissions: $('permissions'),
  agentSelect: $('agent-select'), agentSignIn: $('agent-signin'), agentAuthState: $('agent-auth-state'), newSession: $('new-session'), search: $('session-search'),
  list: $('session-list'), empty: $('session-empty'), loadMore: $('load-more'),
  title: $('session-title'), agentLabel: $('session-agent'), conn: $('conn-status'),
  composer: $('composer'), input: $('prompt-input'), send: $('send'), queue: $('queue-send'), stop: $('stop'), cwd: $('cwd-input'),
  toggle: $('sidebar-toggle'), scrim: $('scrim'), download: $('session-download'),
  share: $('share-open'), shareBadge: $('share-badge'), shared: { section: $('shared-section'), list: $('shared-list') },
};
ui.share.addEventListener('click', () => state.current && openShareDialog(state.current.id));
wireDownload(ui.download);

const state = {
  sessions: null, // sessionId → {data, item}: the session list's entries (set below)
  current: null, // {id, cwd, title, agent}, and {role, owner} for a session shared with the user
  running: new Set(), // sessions with a session/prompt in flight
  roots: [], // the user's workspace roots (GET /api/me), the first is the default cwd
};

const conv = new Conversation(ui.log, {
  render: (update) => controls.render(update),
  cwd: () => state.current?.cwd ?? '',
  canFork: () => !state.current?.role,
  fork: (seq, lastSeq) => forkSession(conn, state.current, seq, lastSeq)
    .then((entry) => { upsertSession(entry, { top: true }); openSession(entry.sessionId); })
    .catch(reportError),
});

// Permission requests and questions from agents, as cards (js/asks.js).
const asks = new Asks(ui.permissions, {
  respond: (id, result) => conn.respond(id, result),
  current: () => state.current?.id,
  session: (id) => state.sessions.get(id)?.data,
  showTool(sessionId, toolCall) {
    if (sessionId === state.current?.id && typeof toolCall.toolCallId === 'string' && conv.tools.has(toolCall.toolCallId)) {
      conv.flush();
      conv.renderTool(toolCall);
    }
  },
});

// Images and text files for the next prompt, where the agent takes them, picked, pasted or
// dropped (js/attachments.js).
const attachments = new Attachments({
  tray: $('attachments'), picker: $('attach-picker'), button: $('attach'), input: ui.input, dropZone: ui.composer,
  onError: (message) => conv.note(message),
});

// Messages typed while the agent works, kept by the gateway for every tab (js/queue.js).
const queue = new PromptQueue($('queued'), {
  request: (method, params) => conn.request(method, params),
  changed: (id) => { if (id === state.current?.id) updateComposer(); },
  error: (err) => reportError(err),
});

// The cwd picker, modes, config options, slash commands and usage (js/controls.js).
const controls = new Controls({
  request: (method, params) => conn.request(method, params),
  api,
  append: (node) => conv.append(node),
  flush: () => conv.flush(),
  defaultCwd: () => defaultCwd(),
  roots: () => state.roots,
});

const conn = new Connection({
  onStatus(status) {
    ui.conn.textContent = status;
    ui.conn.dataset.state = status;
  },
  onReady() {
    reportVisibility();
    attachments.configure(conn.info?.agentCapabilities?.promptCapabilities, conn.info?._meta?.gateway?.attachmentBytes);
    syncSession();
    agentLogin.refresh();
  },
  onMessage: handleMessage,
  onDrop() {
    // Permission request ids belong to the dropped connection: they cannot be answered any more.
    asks.clear();
  },
  onError: (err) => conv.error(err),
  async authOk() {
    let status;
    try {
      status = (await fetch('/api/me', { credentials: 'same-origin' })).status;
    } catch {
      return true; // network trouble: keep retrying
    }
    if (status !== 401) return true;
    showSignIn();
    return false;
  },
});
onLeave(() => conn.close());
onUnauthorized(showSignIn);

// --- agents --------------------------------------------------------------------------------

// The header's agent select (js/agent-picker.js); `picker.agents` is the agents offered.
const picker = new AgentPicker(ui.agentSelect, { error: (err) => conv.error(err) });
const loadAgents = () => picker.load();

function useAgent(name) {
  if (name === conn.agent && !conn.stopped) return;
  if (name) picker.remember(name);
  conn.open(name);
}

ui.agentSelect.addEventListener('change', () => {
  setCurrent(null);
  agentLogin.close();
  useAgent(ui.agentSelect.value);
});

// --- agent login (js/agent-login.js) -------------------------------------------------------

const agentLogin = new AgentLogin({
  conn, container: ui.permissions, badge: ui.agentAuthState,
  agents: () => picker.agents,
  reloadAgents: () => loadAgents(),
  note: (text) => conv.note(text),
  error: (err) => reportError(err),
  focus: () => ui.input.focus(),
});
const authMethods = () => agentLogin.methods();
const showAgentLogin = (err, retry) => agentLogin.show(err, retry);

ui.agentSignIn.addEventListener('click', () => {
  closeSidebar();
  showAgentLogin(null, null);
});

// --- session list --------------------------------------------------------------------------

// The sidebar's list (js/session-list.js); its entries are the app's sessions.
const sessionList = new SessionList({ list: ui.list, empty: ui.empty, loadMore: ui.loadMore, search: ui.search, archiveToggle: $('archive-toggle') }, {
  open: (id) => openSession(id),
  remove: (id) => deleteSession(id),
  current: () => state.current?.id,
  badges: () => picker.agents.length > 1,
  error: (err) => conv.error(err),
});
state.sessions = sessionList.entries;
const upsertSession = (data, options) => sessionList.upsert(data, options);
const loadSessions = (options) => sessionList.load(options);

/** Local bookkeeping after a prompt: newest first, and a title from the first prompt. */
function touchSession(id, promptText) {
  const entry = state.sessions.get(id);
  if (!entry) return;
  const patch = { updatedAt: new Date().toISOString() };
  if (promptText && !entry.data.title) patch.title = promptText.split('\n')[0].slice(0, 80);
  upsertSession({ ...entry.data, ...patch }, { top: true });
  shareSession(state.sessions.get(id).data, true);
  if (patch.title && id === state.current?.id) setTitle(patch.title);
}

function setTitle(title) {
  if (state.current) state.current.title = title;
  ui.title.textContent = state.current ? title || 'Untitled session' : 'No session selected';
  setBaseTitle(state.current ? `${title || 'Untitled session'} · ACP Gateway` : 'ACP Gateway');
}

async function deleteSession(id) {
  const entry = state.sessions.get(id);
  if (!confirm(`Delete session “${sessionTitle(entry?.data)}”? This cannot be undone.`)) return;
  try {
    await api(`/api/sessions/${encodeURIComponent(id)}`, { method: 'DELETE' });
  } catch (err) {
    if (err.status === 401) return;
    if (err.status !== 404) return conv.error(err); // 404: already gone, drop it from the list
  }
  forgetSession(id);
  shareDeleted(id);
}

/** Drops a deleted session from the list (and the view). */
function forgetSession(id) {
  sessionList.drop(id);
  controls.forget(id);
  if (state.current?.id === id) setCurrent(null);
}

// --- current session -----------------------------------------------------------------------

function setCurrent(session) {
  state.current = session;
  conv.reset(session?.id ?? null);
  controls.show(session);
  queue.show(session?.id ?? null);
  showDownload(ui.download, session?.role ? null : session?.id);
  ui.share.hidden = !session || !!session.role;
  ui.shareBadge.hidden = !session?.role;
  ui.shareBadge.textContent = session?.role ? `${session.role === 'observer' ? 'Observing' : 'Controlling'} ${session.owner}’s session` : '';
  setTitle(session?.title ?? '');
  ui.agentLabel.textContent = session?.agent ? `agent: ${session.agent}` : '';
  sessionList.markCurrent(session?.id);
  updateComposer();
  asks.label();
  reportVisibility();
}

/** Tells the gateway which session this page shows while it is visible: no push for that one. */
function reportVisibility() {
  conn.notify('_gateway/visibility', { sessionId: document.visibilityState === 'visible' ? state.current?.id ?? null : null });
}
document.addEventListener('visibilitychange', reportVisibility);

/** Opens session `id`, listed or not (a push's link: `/?session=ID`). */
function openById(id) {
  if (state.sessions.has(id)) return openSession(id);
  setCurrent({ id, cwd: defaultCwd(), title: '', agent: conn.agent });
  if (conn.ready) syncSession();
}
// A tapped push, while a page is open (static/sw.js).
navigator.serviceWorker?.addEventListener('message', (event) => {
  if (event.data?.type === 'open-session' && typeof event.data.sessionId === 'string' && event.data.sessionId) openById(event.data.sessionId);
});

/** Loads the current session, or catches up with what was missed (afterSeq) after a reconnect. */
function syncSession() {
  if (!ui.cwd.value) ui.cwd.value = defaultCwd();
  const current = state.current;
  if (!current) return;
  conv.flush();
  // A restore names the session's own stored cwd (the gateway checks it against the roots).
  // A session shared with the user is joined with session/attach, in the role its share gives.
  const params = current.role ? { sessionId: current.id } : { sessionId: current.id, cwd: current.cwd || defaultCwd(), mcpServers: [] };
  if (conv.lastSeq > 0) params._meta = { gateway: { afterSeq: conv.lastSeq } };
  queue.forget(current.id); // the load's notice says it again, if there is anything to say
  conv.busy(true);
  conn.request(current.role ? 'session/attach' : 'session/load', params)
    .then((result) => controls.loaded(current.id, result, { running: state.running.has(current.id) }))
    .catch((err) => {
      if (state.current !== current) return;
      // The agent wants its user signed in before it restores a session: after the sign-in the
      // load is tried again.
      if (err instanceof RpcError && err.code === AUTH_REQUIRED && authMethods().length) {
        showAgentLogin(err, (note) => { conv.note(note); syncSession(); });
      } else if (current.role && err instanceof RpcError && err.code === -32002) {
        conv.error(new Error(`This session is no longer shared with you (${current.owner} revoked it, or the share ended).`));
        loadShared();
      } else {
        reportError(err);
      }
    })
    .finally(() => { if (state.current === current) updateComposer(); });
}

/** Opens a session someone shared with the user (`entry` from js/sharing.js). */
function openShared(entry) {
  closeSidebar();
  setCurrent(entry);
  if (entry.agent && (entry.agent !== conn.agent || conn.stopped)) useAgent(entry.agent); // onReady will attach
  else if (conn.ready) syncSession();
}
const loadShared = () => loadSharedWithMe(ui.shared, openShared).catch(() => []);

function openSession(id) {
  const data = state.sessions.get(id)?.data;
  if (!data) return;
  closeSidebar();
  const agent = data._meta?.agent ?? conn.agent;
  if (picker.agents.length && !picker.agents.some((a) => a.name === agent)) {
    return conv.error(new Error(`agent “${agent}” is not configured on this gateway`));
  }
  setCurrent({ id, cwd: data.cwd || defaultCwd(), title: data.title ?? '', agent });
  if (agent !== conn.agent || conn.stopped) useAgent(agent); // onReady will load it
  else if (conn.ready) syncSession();
}

/** The user's first workspace root: from /api/me, else from `initialize`, else `/` (older gateways). */
function defaultCwd() {
  const fromInit = conn.info?._meta?.gateway?.workspaceRoots;
  const roots = state.roots.length ? state.roots : Array.isArray(fromInit) ? fromInit : [];
  return roots.find((r) => typeof r === 'string' && r) ?? '/';
}

/** The session/new in flight, if any: a prompt sent meanwhile goes to it, and a second click
 * does not make another. */
let creating = null;

function newSession() {
  creating ??= createSession().finally(() => { creating = null; });
  return creating;
}

async function createSession() {
  const cwd = ui.cwd.value.trim() || defaultCwd();
  let result;
  try {
    result = await conn.request('session/new', { cwd, mcpServers: [] });
  } catch (err) {
    if (err instanceof RpcError && err.code === AUTH_REQUIRED && authMethods().length) {
      showAgentLogin(err, async (note) => { await createSession(); conv.note(note); });
      throw new AgentLoginNeeded();
    }
    throw err;
  }
  agentLogin.close();
  const now = new Date().toISOString();
  upsertSession({ sessionId: result.sessionId, cwd, title: null, createdAt: now, updatedAt: now,
    _meta: { messageCount: 0, agent: conn.agent } }, { top: true });
  shareSession(state.sessions.get(result.sessionId).data, true);
  controls.loaded(result.sessionId, result, { fresh: true });
  setCurrent({ id: result.sessionId, cwd, title: '', agent: conn.agent });
  return result.sessionId;
}

ui.newSession.addEventListener('click', async () => {
  closeSidebar();
  ui.newSession.disabled = true;
  try {
    await newSession();
    ui.input.focus();
  } catch (err) {
    reportError(err);
  } finally {
    ui.newSession.disabled = false;
  }
});

function reportError(err) {
  if (err instanceof AgentLoginNeeded) return; // the sign-in card says it
  if (err instanceof ConnectionLost) conv.note('Connection lost; catching up after reconnecting…');
  else conv.error(err);
}

// --- prompting -----------------------------------------------------------------------------

/** Whether a turn of session `id` runs: one this tab started, or one the gateway says runs. */
const turnRuns = (id) => state.running.has(id) || queue.running(id);

const PLACEHOLDER = ui.input.placeholder;

function updateComposer() {
  const running = !!state.current && turnRuns(state.current.id);
  // While a turn runs the box stays usable: what is sent then is queued (js/queue.js).
  ui.send.hidden = running;
  ui.queue.hidden = !running;
  // An observer sees the session and can do nothing to it: no prompt, no stop, no controls.
  const observing = state.current?.role === 'observer';
  ui.stop.hidden = !running || observing;
  $('session-controls').inert = observing;
  ui.input.disabled = ui.send.disabled = observing;
  ui.input.placeholder = observing ? `You are observing ${state.current.owner}’s session (read-only)` : PLACEHOLDER;
  conv.busy(running);
}

/** Queues the prompt in the box for after the current turn. */
async function queuePrompt(id, text) {
  const attached = attachments.blocks();
  const prompt = [...(text ? [{ type: 'text', text }] : []), ...attached];
  ui.input.value = '';
  attachments.clear();
  try {
    await queue.add(id, prompt);
  } catch (err) {
    if (!ui.input.value) ui.input.value = text;
    if (!attachments.count) attachments.restore(attached);
    reportError(err);
  }
}

async function sendPrompt() {
  const text = ui.input.value.trim();
  if (!text && !attachments.count) return;
  if (state.current && !creating && turnRuns(state.current.id)) return queuePrompt(state.current.id, text);
  askForNotifications(); // before any await: the browser wants the user's gesture

  ui.input.value = '';
  const attached = attachments.blocks();
  attachments.clear();
  const giveBack = () => {
    if (!ui.input.value) ui.input.value = text;
    if (!attachments.count) attachments.restore(attached);
  };
  // A session being made (New session, just clicked) is where the user is about to be.
  let id = creating ? null : state.current?.id;
  if (!id) {
    try {
      id = await newSession();
    } catch (err) {
      giveBack();
      return reportError(err);
    }
  }
  const prompt = [...(text ? [{ type: 'text', text }] : []), ...attached];
  conv.localPrompt(text, attached);
  controls.beginTurn(id);
  state.running.add(id);
  updateComposer();
  touchSession(id, text);
  try {
    const result = await conn.request('session/prompt', { sessionId: id, prompt });
    controls.endTurn(id, result);
    const reason = result?.stopReason && result.stopReason !== 'end_turn' ? result.stopReason.replace(/_/g, ' ') : '';
    notice({ sessionId: id, kind: 'turn', title: reason ? `Turn stopped: ${reason}` : 'The agent finished its turn',
      body: sessionTitle(state.sessions.get(id)?.data) });
    if (state.current?.id === id && result?.stopReason && result.stopReason !== 'end_turn') {
      conv.note(`Stopped: ${result.stopReason.replace(/_/g, ' ')}`);
    }
  } catch (err) {
    controls.endTurn(id, null);
    // Not signed in (claude-agent-acp answers a prompt so): the text goes back into the box and
    // is sent again once the user has signed in, never lost.
    if (err instanceof RpcError && err.code === AUTH_REQUIRED && authMethods().length && state.current?.id === id) {
      giveBack();
      showAgentLogin(err, (note) => { conv.note(note); return sendPrompt(); });
      return;
    }
    // Refused before it reached the agent (the owner's keys are not lent to this share): the
    // text goes back into the box, as it was typed.
    if (err instanceof RpcError && err.data?.reason === 'owner_keys' && state.current?.id === id) giveBack();
    if (state.current?.id === id) reportError(err);
    // A lost connection is no verdict: the turn may go on, and the catch-up shows how it ended.
    if (!(err instanceof ConnectionLost)) {
      notice({ sessionId: id, kind: 'turn', title: 'The turn failed', body: `${sessionTitle(state.sessions.get(id)?.data)}: ${err.message}` });
    }
  } finally {
    state.running.delete(id);
    updateComposer();
    touchSession(id);
  }
}

ui.composer.addEventListener('submit', (event) => {
  event.preventDefault();
  sendPrompt();
});
ui.input.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendPrompt();
  } else if (event.key === 'Escape' && !ui.stop.hidden) {
    ui.stop.click();
  }
});
ui.stop.addEventListener('click', () => {
  if (state.current) conn.notify('session/cancel', { sessionId: state.current.id });
});

// --- messages from the agent ---------------------------------------------------------------

function handleMessage(msg) {
  const params = msg.params ?? {};
  switch (msg.method) {
    case 'session/update': {
      const update = params.update ?? {};
      controls.observe(params); // every session's modes, options, commands, usage; before any render
      // A title that is not a string (or null, to clear it) is ignored: it would break the session list.
      if (update.sessionUpdate === 'session_info_update' && (typeof update.title === 'string' || update.title === null)) {
        const entry = state.sessions.get(params.sessionId);
        if (entry) shareSession(upsertSession({ ...entry.data, title: update.title }).data);
        if (params.sessionId === state.current?.id) setTitle(update.title ?? '');
      }
      if (params.sessionId === state.current?.id) conv.enqueue(params);
      return;
    }
    case 'session/request_permission':
      if (msg.id != null) asks.permission(msg.id, params);
      return;
    case 'elicitation/create':
      if (msg.id != null) asks.elicitation(msg.id, params);
      return;
    case '_gateway/authenticate/progress':
      agentLogin.progress(params);
      return;
    case '_gateway/queue':
      queue.observe(params);
      return;
    case '_gateway/session_stopped':
      if (params.sessionId === state.current?.id) conv.note(typeof params.reason === 'string' ? params.reason : 'This session was stopped.');
      return;
    case '$/cancel_request': {
      asks.drop(String(params.requestId));
      return;
    }
    default:
      if (msg.id != null) conn.respondError(msg.id, -32601, 'method not supported by the web UI');
  }
}

// --- layout, shortcuts, attention, other tabs (js/*.js) ------------------------------------

initLayout({ app: ui.app, sidebar: $('sidebar'), toggle: ui.toggle, scrim: ui.scrim, close: $('sidebar-close'),
  inertWhenOpen: [$('main'), $('skip-link')] });
installShortcuts();

// A notification was clicked: its session, with the permission card (if any) in view.
initAttention({
  open(sessionId, key) {
    if (sessionId !== state.current?.id && state.sessions.has(sessionId)) openSession(sessionId);
    const card = key != null ? asks.get(key) : null;
    card?.scrollIntoView({ block: 'nearest' });
    card?.querySelector('button')?.focus();
  },
});

// Another tab of this user changed the session list.
const tabHooks = {
  session(data, top) {
    const known = state.sessions.get(data.sessionId);
    if (!known && ui.search.value.trim()) return; // not ours to add to a filtered list
    upsertSession(known ? { ...known.data, ...data } : data, { top });
    if (data.sessionId === state.current?.id && data.title) setTitle(data.title);
  },
  deleted: forgetSession,
};

window.addEventListener('online', () => conn.reconnectNow());

// --- administration and spending ------------------------------------------------------------

$('admin-open').addEventListener('click', async () => (await import('./js/admin.js')).openAdmin());
// The help dialog's push section is filled whenever the dialog opens (button or "?").
new MutationObserver(() => { if ($('shortcuts-dialog').open) { renderPush(); renderDevices(); } })
  .observe($('shortcuts-dialog'), { attributes: true, attributeFilter: ['open'] });
$('mcp-open').addEventListener('click', async () => (await import('./js/mcp-settings.js')).openMcpSettings());

// --- boot ----------------------------------------------------------------------------------

async function boot() {
  const shareToken = takeShareToken(); // before a sign-in can take the page elsewhere
  let me;
  try {
    me = await api('/api/me');
  } catch (err) {
    if (err.status === 401) return;
    // The server is unreachable or broken: show the app and let the socket retry.
    me = { user: '' };
  }
  ui.signin.hidden = true;
  ui.app.hidden = false;
  $('user-name').textContent = me?.user ?? '';
  $('admin-open').hidden = me?.admin !== true;
  showMyUsage($('my-usage'));
  initTabs(me?.user ?? '', tabHooks);
  state.roots = Array.isArray(me?.workspaceRoots) ? me.workspaceRoots.filter((r) => typeof r === 'string') : [];
  if (state.roots.length) ui.cwd.value = state.roots[0];
  setCurrent(null);
  const agent = await loadAgents();
  useAgent(agent);
  await loadSessions().catch(() => {});
  await loadShared();
  // Opened from a share link: redeemed, then opened in the role it gives.
  if (shareToken) openShareLink(shareToken, { me: me?.user, listed: loadShared, open: openShared, own: openById, agent: conn.agent }).catch((err) => conv.error(err));
  // Opened from a push: the session it is about.
  const asked = new URLSearchParams(location.search).get('session');
  if (asked) {
    history.replaceState(null, '', '/');
    openById(asked);
  }
  ui.input.focus();
}

boot();
