// Signing an agent in, the way the agent describes it in `initialize`'s `authMethods`:
// - `env_var` (codex's CODEX_API_KEY / OPENAI_API_KEY): a form naming the method's variables;
//   the values go to `PUT /api/agents/{agent}/keys`, sealed by the gateway, given only to this
//   user's processes of that agent, and are never shown again (only "set" and when);
// - `agent` (the default; codex's `chatgpt`): a button that sends ACP `authenticate` to the
//   user's own agent process; its answer or error is shown verbatim with the description;
// - `terminal` (claude's `claude /login`): opens signin-terminal.html, where the program runs for
//   this user in an in-page terminal (xterm.js), in their sandbox on the server.
// After a sign-in, `onSignedIn` retries what failed (a new session, the prompt the user typed).
// While an `agent` method runs, what the agent tells the user meanwhile (a URL, a device code)
// arrives as `_gateway/authenticate/progress` and is shown in the card (`card.progress`); a URL
// is a link the user clicks, never opened for them. Agent strings only ever go to textContent.

import { el as h, isString, str } from './dom.js';

/** The methods an `initialize` result lists (those with an id). */
export function methodsOf(info) {
  const methods = info?.authMethods;
  return Array.isArray(methods) ? methods.filter((m) => m && isString(m.id)) : [];
}

/** The method's type: `agent` unless it says otherwise. */
const typeOf = (method) => (isString(method.type) ? method.type : 'agent');

const nameOf = (method) => str(method.name) || method.id;

/** The variables an `env_var` method asks for. */
function varsOf(method) {
  return Array.isArray(method.vars) ? method.vars.filter((v) => v && isString(v.name)) : [];
}

/**
 * A card offering every method. `error` is what the agent said (or null when the user opened it);
 * `keys` the variables this user has set for the agent ({name, updatedAt}); `authenticate(id)`
 * sends ACP `authenticate`; `onSignedIn(name)` runs after a sign-in, `onSignedOut()` after one.
 */
export function signInCard({ agent, methods, error, keys = [], login = null, authenticate, onSignedIn, onSignedOut }) {
  const status = h('p', { class: 'agent-auth-status', role: 'status', testid: 'agent-auth-status' });
  const notes = h('ul', { class: 'agent-auth-progress', testid: 'agent-auth-progress', 'aria-live': 'polite' });
  const controls = [];
  const busy = (on) => controls.forEach((c) => { c.disabled = on; });
  const say = (state, text) => { status.dataset.state = state; status.textContent = text; };
  const failed = (what, err) => say('failed', `${what} failed: ${err.message}${err.code != null ? ` (code ${err.code})` : ''}`);

  const done = async (name) => {
    say('ok', `Signed in with ${name}.`);
    card.remove();
    await onSignedIn(name);
  };

  const agentMethod = (method) => {
    const button = h('button', {
      type: 'button', class: 'secondary', testid: 'auth-method', 'data-method-id': method.id, text: nameOf(method),
      onclick: async () => {
        busy(true);
        say('pending', `Signing in with ${nameOf(method)}…`);
        try {
          await authenticate(method.id);
        } catch (err) {
          busy(false);
          return failed('Sign-in', err);
        }
        await done(nameOf(method));
      },
    });
    controls.push(button);
    return [button];
  };

  const envVarMethod = (method) => {
    const inputs = varsOf(method).map((v) => {
      const set = keys.find((k) => k.name === v.name);
      const input = h('input', {
        type: 'password', autocomplete: 'off', spellcheck: 'false', required: v.optional !== true,
        name: v.name, testid: 'auth-var', 'data-var': v.name,
        placeholder: set ? 'set; type to replace' : '',
      });
      controls.push(input);
      return h('label', { class: 'agent-auth-var' },
        h('span', { text: v.name }), input,
        set ? h('span', { class: 'muted small', testid: 'auth-var-set', text: `set ${new Date(set.updatedAt).toLocaleString()}` }) : null);
    });
    const submit = h('button', { type: 'submit', class: 'secondary', testid: 'auth-method', 'data-method-id': method.id, text: `Save ${nameOf(method)}` });
    controls.push(submit);
    const form = h('form', {
      class: 'agent-auth-form', testid: 'auth-env-form',
      onsubmit: async (event) => {
        event.preventDefault();
        const vars = {};
        for (const input of form.querySelectorAll('input')) if (input.value) vars[input.name] = input.value;
        busy(true);
        say('pending', `Saving ${nameOf(method)}…`);
        try {
          await putKeys(agent, { methodId: method.id, vars });
        } catch (err) {
          busy(false);
          return failed('Saving the key', err);
        }
        form.reset();
        await done(nameOf(method));
      },
    }, inputs, submit);
    return [form];
  };

  const terminalMethod = (method) => {
    const auth = method._meta?.['terminal-auth'];
    const line = [str(auth?.command), ...(Array.isArray(auth?.args) ? auth.args : Array.isArray(method.args) ? method.args : [])]
      .filter(isString).join(' ');
    // The program runs on the server for this user; its terminal opens in a page of its own
    // (signin-terminal.html), which says here when it exited 0.
    const button = h('button', {
      type: 'button', class: 'secondary', testid: 'auth-method', 'data-method-id': method.id,
      text: `Open ${str(auth?.label) || nameOf(method)} in a terminal`,
      onclick: () => {
        const channel = new BroadcastChannel('acp-gateway-signin');
        channel.onmessage = async (event) => {
          if (event.data?.agent !== agent || event.data?.method !== method.id || !event.data?.ok) return;
          channel.close();
          await done(nameOf(method));
        };
        say('pending', 'Follow the sign-in in the terminal page; this card goes when it succeeds.');
        window.open(`/signin-terminal.html?agent=${encodeURIComponent(agent)}&method=${encodeURIComponent(method.id)}`, '_blank');
      },
    });
    controls.push(button);
    return [button, line ? h('span', { class: 'muted small', testid: 'auth-terminal', text: `runs ${line}` }) : null];
  };

  const items = methods.map((method) => {
    const type = typeOf(method);
    const body = type === 'env_var' ? envVarMethod(method) : type === 'terminal' ? terminalMethod(method) : agentMethod(method);
    const about = str(method.description) ? h('span', { class: 'muted small', text: method.description }) : null;
    return h('li', { 'data-type': type }, type === 'agent' ? null : h('strong', { text: nameOf(method) }), body, about);
  });

  const signOut = keys.length || login ? h('button', {
    type: 'button', class: 'secondary', testid: 'agent-sign-out', text: keys.length ? 'Sign out (remove my keys)' : 'Sign out',
    onclick: async () => {
      busy(true);
      try {
        await deleteKeys(agent);
      } catch (err) {
        busy(false);
        return failed('Signing out', err);
      }
      say('ok', keys.length ? 'Signed out: your keys for this agent are removed.' : 'Signed out.');
      card.remove();
      onSignedOut?.();
    },
  }) : null;
  if (signOut) controls.push(signOut);

  const close = h('button', { type: 'button', class: 'secondary small', text: 'Close', onclick: () => card.remove() });
  const card = h('div', { class: 'agent-auth', role: 'group', 'aria-labelledby': 'agent-auth-title', testid: 'agent-auth' },
    h('p', { id: 'agent-auth-title', class: 'agent-auth-title' },
      h('strong', { text: error ? 'The agent needs you to sign in. ' : `Sign in to ${agent}. ` }),
      error ? h('span', { class: 'muted', text: error.message }) : null),
    login ? h('p', { class: 'muted small', testid: 'agent-auth-login', text: `Signed in with ${login.methodId} ${new Date(login.signedInAt).toLocaleString()}.` }) : null,
    h('ul', { class: 'agent-auth-methods' }, items),
    notes,
    h('div', { class: 'agent-auth-actions' }, signOut, close),
    status);
  /** One thing the agent said for the user while signing in (`_gateway/authenticate/progress`). */
  card.progress = (note) => {
    const text = str(note?.text) || summary(note?.params);
    const url = isString(note?.url) && /^https?:\/\//i.test(note.url) ? note.url : null;
    if (!text && !url) return;
    notes.append(h('li', { testid: 'agent-auth-note' },
      h('span', { text }),
      url ? h('a', { href: url, target: '_blank', rel: 'noopener noreferrer', testid: 'agent-auth-link', title: url, text: 'Open' }) : null));
  };
  return card;
}

/** An agent notification's params as one line: its top-level strings and numbers. */
function summary(params) {
  if (!params || typeof params !== 'object') return '';
  return Object.entries(params)
    .filter(([k, v]) => !k.startsWith('_') && (isString(v) || typeof v === 'number'))
    .map(([k, v]) => `${k}: ${v}`).join(', ');
}

/**
 * What is known of the user's sign-in to an agent: the agent's own answer to the draft
 * `auth/status` where it advertises `agentCapabilities.auth.status` (`ask()` sends it), else what
 * the gateway recorded in /api/agents (a key, a completed login), else null (unknown).
 */
export async function authState(info, entry, ask) {
  if (info?.agentCapabilities?.auth?.status === true) {
    try {
      const answer = await ask();
      if (typeof answer?.authenticated === 'boolean') return { signedIn: answer.authenticated, text: str(answer.message) };
    } catch { /* the gateway's record, below */ }
  }
  if (entry?.login || (Array.isArray(entry?.keys) && entry.keys.length)) return { signedIn: true, text: '' };
  return null;
}

/** Shows `state` (from authState) in the badge beside the Sign in button. */
export function showAuthState(badge, state) {
  badge.hidden = !state;
  if (!state) return;
  badge.dataset.state = state.signedIn ? 'in' : 'out';
  badge.textContent = state.signedIn ? 'signed in' : 'not signed in';
  badge.title = state.text;
}

async function putKeys(agent, body) {
  const res = await fetch(`/api/agents/${encodeURIComponent(agent)}/keys`, {
    method: 'PUT', credentials: 'same-origin', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(await reason(res));
}

async function deleteKeys(agent) {
  const res = await fetch(`/api/agents/${encodeURIComponent(agent)}/keys`, { method: 'DELETE', credentials: 'same-origin' });
  if (!res.ok) throw new Error(await reason(res));
}

/** The gateway's `{"error": …}`, or the status. */
async function reason(res) {
  try {
    const body = await res.json();
    if (isString(body?.error)) return body.error;
  } catch { /* not JSON */ }
  return `HTTP ${res.status}`;
}
