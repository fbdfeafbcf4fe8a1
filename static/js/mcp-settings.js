// "Your MCP servers": the HTTP/SSE MCP servers a user adds to every new session of theirs
// (/api/mcp-servers). Header values are typed here once and sent to the gateway, which keeps
// them encrypted; they are never shown again (the list names the headers only), and editing a
// server without retyping a value keeps the stored one. Strings only ever go to textContent.

import { el as h } from './dom.js';
import { send } from './http.js';

const path = (name) => `/api/mcp-servers/${encodeURIComponent(name)}`;

/** One header row of the form: a name, and a value (blank on a stored header: unchanged). */
function headerRow(name = '', stored = false) {
  const nameInput = h('input', { type: 'text', value: name, placeholder: 'Header (e.g. Authorization)', autocomplete: 'off',
    spellcheck: 'false', 'aria-label': 'Header name', testid: 'mcp-header-name' });
  const valueInput = h('input', { type: 'password', placeholder: stored ? 'unchanged (stored encrypted)' : 'Value', autocomplete: 'off',
    'aria-label': 'Header value', testid: 'mcp-header-value' });
  const row = h('div', { class: 'mcp-header-row' }, nameInput, valueInput,
    h('button', { type: 'button', class: 'secondary small', text: '×', 'aria-label': 'Remove this header', onclick: () => row.remove() }));
  row.read = () => {
    const n = nameInput.value.trim();
    if (!n) return null;
    return valueInput.value ? { name: n, value: valueInput.value } : { name: n };
  };
  return row;
}

/** Opens the dialog. */
export function openMcpSettings() {
  const status = h('p', { class: 'muted small', role: 'status' });
  const error = h('p', { class: 'error', role: 'alert', testid: 'mcp-error', hidden: true });
  const list = h('ul', { class: 'mcp-list', testid: 'mcp-list' });
  const name = h('input', { type: 'text', required: true, maxlength: '64', autocomplete: 'off', spellcheck: 'false', testid: 'mcp-name' });
  const type = h('select', { testid: 'mcp-type' }, h('option', { value: 'http', text: 'HTTP' }), h('option', { value: 'sse', text: 'SSE' }));
  const url = h('input', { type: 'url', required: true, placeholder: 'https://mcp.example.com/mcp', autocomplete: 'off', spellcheck: 'false', testid: 'mcp-url' });
  const headers = h('div', { class: 'mcp-headers' });
  const fail = (err) => { error.textContent = err.message; error.hidden = false; };
  const reset = () => {
    form.reset();
    name.readOnly = false;
    headers.replaceChildren(headerRow());
  };
  const edit = (server) => {
    name.value = server.name;
    name.readOnly = true;
    type.value = server.type;
    url.value = server.url;
    headers.replaceChildren(...server.headers.map((n) => headerRow(n, true)), headerRow());
    url.focus();
  };
  const load = async () => {
    const answer = await send('GET', '/api/mcp-servers');
    form.hidden = !answer.enabled;
    status.textContent = !answer.enabled
      ? 'This gateway does not take your own MCP servers.'
      : answer.allowedHosts?.length ? `Allowed hosts: ${answer.allowedHosts.join(', ')}.` : '';
    list.replaceChildren(...(answer.servers.length ? answer.servers.map((s) => h('li', { class: 'mcp-server', testid: 'mcp-server' },
      h('div', { class: 'mcp-server-main' },
        h('strong', { text: s.name }), h('span', { class: 'badge small', text: s.type.toUpperCase() }),
        h('code', { class: 'mcp-url', text: s.url }),
        s.headers.length ? h('span', { class: 'muted small', testid: 'mcp-header-names', text: s.headers.map((n) => `${n}: ••••`).join(', ') }) : null),
      h('button', { type: 'button', class: 'secondary small', text: 'Edit', 'aria-label': `Edit ${s.name}`, onclick: () => edit(s) }),
      h('button', { type: 'button', class: 'danger small', text: 'Remove', testid: 'mcp-remove', 'aria-label': `Remove ${s.name}`,
        onclick: () => send('DELETE', path(s.name)).then(load).catch(fail) })))
      : [h('li', { class: 'muted', text: 'None yet.' })]));
  };
  const form = h('form', { class: 'mcp-form', testid: 'mcp-form' },
    h('label', { class: 'field' }, h('span', { text: 'Name' }), name),
    h('label', { class: 'field' }, h('span', { text: 'Transport' }), type),
    h('label', { class: 'field' }, h('span', { text: 'URL' }), url),
    h('fieldset', { class: 'mcp-headers-set' }, h('legend', { text: 'Headers (values are stored encrypted and never shown again)' }), headers,
      h('button', { type: 'button', class: 'secondary small', text: 'Add header', onclick: () => headers.append(headerRow()) })),
    h('div', { class: 'dialog-actions' },
      h('button', { type: 'button', class: 'secondary', text: 'Clear', onclick: reset }),
      h('button', { type: 'submit', class: 'primary', text: 'Save server', testid: 'mcp-save' })));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.hidden = true;
    const body = { type: type.value, url: url.value.trim(), headers: [...headers.children].map((r) => r.read()).filter(Boolean) };
    try {
      await send('PUT', path(name.value.trim()), body);
      reset();
      await load();
    } catch (err) { fail(err); }
  });
  const close = h('button', { type: 'button', class: 'secondary small', text: 'Close', testid: 'mcp-close', onclick: () => dialog.close() });
  const dialog = h('dialog', { class: 'admin-dialog mcp-dialog', 'aria-labelledby': 'mcp-heading', testid: 'mcp-dialog' },
    h('div', { class: 'admin-head' }, h('h2', { id: 'mcp-heading', text: 'Your MCP servers' }), close),
    h('p', { class: 'muted small', text: 'Added to every new session of yours, for agents that take HTTP or SSE MCP servers.' }),
    status, list, form, error);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  reset();
  load().catch(fail);
}
