// The page of a terminal sign-in (signin-terminal.html?agent=NAME&method=ID): the agent's login
// program (`claude /login`, …) runs for this user only, in their sandbox with their HOME, in a
// pseudo-terminal bridged to this xterm.js terminal over the authenticated WebSocket route
// /api/agents/{agent}/login/terminal (the browser's cookie; binary frames are terminal bytes,
// text frames control: resize and cancel out, one exit or error in). When the program exits 0
// the page that opened this one is told (BroadcastChannel `acp-gateway-signin`) and retries
// what failed; closing this page ends the program.

import { Terminal } from '../vendor/xterm.js';

const params = new URLSearchParams(location.search);
const agent = params.get('agent') ?? '';
const method = params.get('method') ?? '';
const status = document.getElementById('terminal-status');
const cancel = document.getElementById('terminal-cancel');
document.getElementById('terminal-title').textContent = `Sign in to ${agent}`;

const say = (state, text) => { status.dataset.state = state; status.textContent = text; };

const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 14, scrollback: 2000 });
term.open(document.getElementById('terminal'));

/** Columns and rows that fit the terminal's box (xterm's fit addon, in a few lines). */
function fit() {
  const box = document.getElementById('terminal').getBoundingClientRect();
  const cell = term._core?._renderService?.dimensions?.css?.cell;
  if (!cell?.width || !cell?.height) return;
  const cols = Math.max(20, Math.floor(box.width / cell.width));
  const rows = Math.max(5, Math.floor(box.height / cell.height));
  if (cols !== term.cols || rows !== term.rows) term.resize(cols, rows);
}

const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
const ws = new WebSocket(`${scheme}//${location.host}/api/agents/${encodeURIComponent(agent)}/login/terminal?method=${encodeURIComponent(method)}`);
ws.binaryType = 'arraybuffer';
let ended = false;
const control = (message) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message)); };
const encoder = new TextEncoder();

ws.addEventListener('open', () => {
  say('running', 'Running the agent\'s sign-in. Follow what it says below.');
  fit();
  control({ type: 'resize', cols: term.cols, rows: term.rows });
  term.focus();
});
ws.addEventListener('message', (event) => {
  if (typeof event.data !== 'string') {
    term.write(new Uint8Array(event.data));
    return;
  }
  let message;
  try { message = JSON.parse(event.data); } catch { return; }
  ended = true;
  cancel.disabled = true;
  if (message.type === 'exit' && message.code === 0) {
    say('ok', 'Signed in. You can close this page.');
    new BroadcastChannel('acp-gateway-signin').postMessage({ agent, method, ok: true });
  } else if (message.type === 'exit') {
    say('failed', `The sign-in program ended with code ${message.code}${message.signal ? ` (signal ${message.signal})` : ''}.`);
  } else {
    say('failed', `The sign-in ended: ${String(message.message ?? 'unknown error')}`);
  }
});
ws.addEventListener('close', () => {
  if (!ended) say('failed', 'The connection closed (not signed in, an unknown method, or one sign-in already running).');
  cancel.disabled = true;
});

term.onData((data) => { if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data)); });
term.onResize(({ cols, rows }) => control({ type: 'resize', cols, rows }));
window.addEventListener('resize', fit);
cancel.addEventListener('click', () => control({ type: 'cancel' }));
