// Several tabs of one user in one browser stay consistent. The gateway already keeps most of it:
// every tab has its own socket attached to the sessions it opened, so each gets the
// conversation's updates, and a permission request is asked of every attached client and, once
// one answers, withdrawn from the others with `$/cancel_request` (src/session/requests.rs).
// What no socket carries is the session list: a session created, renamed, prompted (moved to the
// top) or deleted in one tab. Those go to the other tabs of this origin on a BroadcastChannel.

let channel = null;
let user = null;
/** app.js: {session(data, top), deleted(sessionId)}. */
let hooks = null;

/** Starts listening as `signedInAs` (messages of another user's tabs are ignored). */
export function initTabs(signedInAs, handlers) {
  user = signedInAs;
  hooks = handlers;
  if (channel || typeof BroadcastChannel !== 'function') return;
  channel = new BroadcastChannel('acp-gateway');
  channel.onmessage = (event) => receive(event.data);
}

/** The session list entry `data` (session/list shape) is new or changed; `top`: now the newest. */
export function shareSession(data, top = false) {
  post({ type: 'session', data, top });
}

/** Session `sessionId` was deleted. */
export function shareDeleted(sessionId) {
  post({ type: 'deleted', sessionId });
}

function post(message) {
  if (!channel || user == null) return;
  try {
    channel.postMessage({ ...message, user });
  } catch (err) {
    console.warn('could not tell the other tabs', err);
  }
}

function receive(message) {
  if (!hooks || !message || typeof message !== 'object' || message.user !== user) return;
  if (message.type === 'session' && typeof message.data?.sessionId === 'string') {
    hooks.session(message.data, message.top === true);
  } else if (message.type === 'deleted' && typeof message.sessionId === 'string') {
    hooks.deleted(message.sessionId);
  }
}
