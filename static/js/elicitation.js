// `elicitation/create` (ACP, completed 2026-07-22): the agent asks the user something. Like a
// permission request it reaches every attached client of the session; the first answer wins and
// the gateway withdraws it from the others (`$/cancel_request`). Two modes:
// - form: fields built from `requestedSchema` (strings, numbers, integers, booleans, single and
//   multiple choices), checked by the browser's own constraints before anything is sent;
// - url: the URL is shown as text and opened only when the user clicks (http and https only).
// Answers: `{action: "accept", content}` (form), `{action: "accept"}` (url), `decline`, `cancel`.
// Agent strings only ever go to textContent and attributes of inputs.

import { el as h, isString, str } from './dom.js';

let seq = 0;

/** One input (or group) for property `name` of the schema; `read()` gives its typed value. */
function field(name, schema, required) {
  const id = `elicit-${++seq}`;
  const label = str(schema.title) || name;
  const about = str(schema.description) ? h('span', { class: 'muted small', text: schema.description }) : null;
  const type = str(schema.type);
  const choices = Array.isArray(schema.oneOf) ? schema.oneOf.filter((o) => o && isString(o.const)).map((o) => [o.const, str(o.title) || o.const])
    : Array.isArray(schema.enum) ? schema.enum.filter(isString).map((v) => [v, v]) : null;
  if (type === 'boolean') {
    const input = h('input', { type: 'checkbox', id, name, checked: schema.default === true, testid: 'elicit-field', 'data-name': name });
    return { node: h('label', { class: 'elicit-field elicit-check', for: id }, input, h('span', { text: label }), about), read: () => input.checked };
  }
  if (type === 'array') {
    const items = schema.items ?? {};
    const options = Array.isArray(items.enum) ? items.enum.filter(isString).map((v) => [v, v])
      : Array.isArray(items.anyOf) ? items.anyOf.filter((o) => o && isString(o.const)).map((o) => [o.const, str(o.title) || o.const]) : [];
    const boxes = options.map(([value, text]) => h('label', { class: 'elicit-check' },
      h('input', { type: 'checkbox', value, checked: Array.isArray(schema.default) && schema.default.includes(value), testid: 'elicit-choice', 'data-name': name }),
      h('span', { text })));
    return {
      node: h('fieldset', { class: 'elicit-field' }, h('legend', { text: label }), about, boxes),
      read: () => boxes.map((b) => b.querySelector('input')).filter((i) => i.checked).map((i) => i.value),
    };
  }
  let input;
  if (choices) {
    input = h('select', { id, name, required, testid: 'elicit-field', 'data-name': name },
      required ? null : h('option', { value: '', text: '' }),
      choices.map(([value, text]) => h('option', { value, text, selected: schema.default === value })));
  } else {
    const numeric = type === 'number' || type === 'integer';
    const formats = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' };
    input = h('input', {
      id, name, required, testid: 'elicit-field', 'data-name': name,
      type: numeric ? 'number' : formats[schema.format] ?? 'text',
      step: type === 'integer' ? '1' : type === 'number' ? 'any' : null,
      min: numeric && Number.isFinite(schema.minimum) ? String(schema.minimum) : null,
      max: numeric && Number.isFinite(schema.maximum) ? String(schema.maximum) : null,
      minlength: Number.isInteger(schema.minLength) ? String(schema.minLength) : null,
      maxlength: Number.isInteger(schema.maxLength) ? String(schema.maxLength) : null,
      pattern: isString(schema.pattern) ? schema.pattern : null,
      value: schema.default != null && typeof schema.default !== 'object' ? String(schema.default) : null,
    });
  }
  const read = () => {
    if (input.value === '') return undefined;
    if (type === 'integer') return Number.parseInt(input.value, 10);
    if (type === 'number') return Number(input.value);
    return input.value;
  };
  return { node: h('label', { class: 'elicit-field', for: id }, h('span', { text: label }), input, about), read };
}

/**
 * A card for one `elicitation/create`. `respond(result)` answers the agent; `onDone()` runs after
 * any answer (the caller removes the card and forgets it).
 */
export function elicitationCard(params, respond, onDone) {
  const headingId = `elicit-title-${++seq}`;
  const answer = (result) => { respond(result); onDone(); };
  const decline = h('button', { type: 'button', class: 'secondary', testid: 'elicit-decline', text: 'Decline', onclick: () => answer({ action: 'decline' }) });
  const cancel = h('button', { type: 'button', class: 'secondary', testid: 'elicit-cancel', text: 'Cancel', onclick: () => answer({ action: 'cancel' }) });
  const title = h('p', { id: headingId, class: 'permission-title' }, h('strong', { text: 'The agent asks: ' }), h('span', { text: str(params.message) }));
  let body;
  if (params.mode === 'url') {
    const url = str(params.url);
    let safe = false;
    try { safe = ['http:', 'https:'].includes(new URL(url).protocol); } catch { /* not a URL */ }
    const open = h('button', {
      type: 'button', class: 'secondary', testid: 'elicit-open', text: 'Open the page', disabled: !safe,
      onclick: () => window.open(url, '_blank', 'noopener,noreferrer'),
    });
    const done = h('button', { type: 'button', testid: 'elicit-accept', text: 'Done', onclick: () => answer({ action: 'accept' }) });
    body = [h('p', { class: 'elicit-url' }, h('code', { testid: 'elicit-url', text: url })), h('div', { class: 'permission-options' }, open, done, decline, cancel)];
  } else if (params.mode === 'form' || params.requestedSchema) {
    const schema = params.requestedSchema ?? {};
    const props = schema.properties && typeof schema.properties === 'object' ? Object.entries(schema.properties) : [];
    const required = new Set(Array.isArray(schema.required) ? schema.required.filter(isString) : []);
    const fields = props.filter(([, s]) => s && typeof s === 'object').map(([name, s]) => [name, field(name, s, required.has(name))]);
    const submit = h('button', { type: 'submit', testid: 'elicit-accept', text: 'Submit' });
    const form = h('form', {
      class: 'elicit-form', testid: 'elicit-form', novalidate: false,
      onsubmit: (event) => {
        event.preventDefault();
        if (!form.reportValidity()) return;
        const content = {};
        for (const [name, f] of fields) {
          const value = f.read();
          if (value !== undefined) content[name] = value;
        }
        answer({ action: 'accept', content });
      },
    }, fields.map(([, f]) => f.node), h('div', { class: 'permission-options' }, submit, decline, cancel));
    body = [form];
  } else {
    // A mode this page does not know: never rendered as a known one (the spec); only declined.
    body = [h('p', { class: 'muted', text: `An elicitation of a kind this page cannot show (${str(params.mode) || 'no mode'}).` }),
      h('div', { class: 'permission-options' }, decline, cancel)];
  }
  return h('div', { class: 'permission elicitation', role: 'group', 'aria-labelledby': headingId, testid: 'elicitation' }, title, body);
}
