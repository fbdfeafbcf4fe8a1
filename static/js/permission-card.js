// The card of an agent's permission request (`session/request_permission`): what the tool call
// is, one button per option the agent offers. Agent strings go to textContent only.

import { el as h } from './dom.js';

let permissionSeq = 0;
/** ACP's PermissionOptionKind values: an agent's `kind` becomes a class name only if it is one. */
const PERMISSION_KINDS = new Set(['allow_once', 'allow_always', 'reject_once', 'reject_always']);

/**
 * The card for `params`; `settle(outcome)` is called with the ACP outcome the user chose. Its
 * `.permission-where` span (data-session-id) is for the app to name the session when it is not
 * the open one.
 */
export function permissionCard(params, settle) {
  const toolCall = params.toolCall ?? {};
  const headingId = `permission-${++permissionSeq}`;
  const other = h('span', { class: 'permission-where', 'data-session-id': String(params.sessionId ?? '') });
  // Options that are not objects are skipped (with none left, Dismiss answers `cancelled`): a card
  // that fails to render would leave the agent's turn waiting for an answer that cannot come.
  const offered = Array.isArray(params.options) ? params.options.filter((o) => o && typeof o === 'object') : [];
  const options = offered.map((option) => h('button', {
    type: 'button', class: `permission-option kind-${PERMISSION_KINDS.has(option.kind) ? option.kind : 'other'}`, testid: 'permission-option',
    'data-option-id': option.optionId, text: typeof option.name === 'string' && option.name ? option.name : String(option.optionId),
    onclick: () => settle({ outcome: 'selected', optionId: option.optionId }),
  }));
  if (!options.length) {
    options.push(h('button', { type: 'button', class: 'secondary', text: 'Dismiss',
      onclick: () => settle({ outcome: 'cancelled' }) }));
  }
  return h('div', { class: 'permission', role: 'group', 'aria-labelledby': headingId, testid: 'permission' },
    h('p', { id: headingId, class: 'permission-title' }, 'Permission requested: ',
      h('strong', { text: toolCall.title || toolCall.toolCallId || 'tool call' }), other),
    h('div', { class: 'permission-options' }, options));
}
