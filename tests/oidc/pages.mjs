// The provider's own pages (tests/oidc/provider.mjs): sign-in, sign-out and
// errors, as plain HTML whose ids the browser tests select (README.md beside
// this file). Every value is escaped.

export function esc(value) {
  return String(value ?? '')
    .replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;').replaceAll("'", '&#39;');
}

// Plain pages: no external CSS, fonts or scripts (the default oidc-provider
// pages @import a web font, which must not be fetched from a test machine).
export function page(title, body, extraHead = '') {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>${esc(title)}</title>
<style>body{font-family:sans-serif;max-width:28em;margin:2em auto}label{display:block;margin:.5em 0}
.error{color:#b00020}</style>${extraHead}
</head>
<body>
${body}
</body>
</html>
`;
}

export function loginPage({ uid, clientId, loginHint, error, login }) {
  const value = login ?? loginHint ?? '';
  return page('Sign-in', `<h1>Sign-in</h1>
<p>to continue to <strong id="client-id">${esc(clientId)}</strong></p>
${error ? `<p id="error" class="error" role="alert">${esc(error)}</p>\n` : ''}<form id="login-form" method="post" action="/interaction/${esc(uid)}/login" autocomplete="off">
<label>Login <input type="text" name="login" value="${esc(value)}"${value ? '' : ' autofocus'}></label>
<label>Password <input type="password" name="password"${value ? ' autofocus' : ''}></label>
<button type="submit" id="sign-in">Sign in</button>
</form>
<p><a id="abort" href="/interaction/${esc(uid)}/abort">Cancel</a></p>`);
}

export async function logoutSource(ctx, form) {
  // `form` is oidc-provider's <form id="op.logoutForm"> with the xsrf token.
  // Add logout=yes (end the whole session) and submit it at once.
  const withLogout = form.replace('</form>', '<input type="hidden" name="logout" value="yes"/></form>');
  ctx.type = 'html';
  ctx.body = page('Sign-out', `<h1>Sign-out</h1>
<p>Signing you out&hellip;</p>
${withLogout}
<button type="submit" form="op.logoutForm" id="logout-yes">Yes, sign me out</button>
<script>document.getElementById('op.logoutForm').submit();</script>`);
}

export async function postLogoutSuccessSource(ctx) {
  ctx.type = 'html';
  ctx.body = page('Signed out', '<h1 id="signed-out">Signed out</h1>\n<p>You are signed out.</p>');
}

export async function renderError(ctx, out) {
  ctx.type = 'html';
  ctx.body = page('Error', `<h1>Error</h1>
${Object.entries(out).map(([k, v]) => `<p class="error" data-key="${esc(k)}"><strong>${esc(k)}</strong>: ${esc(v)}</p>`).join('\n')}`);
}
