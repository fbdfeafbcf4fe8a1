// The sign-in page, shown instead of the app while nobody is signed in: the token form (posted
// to /auth/login, never put in a URL), "Sign in with …" when the gateway has an identity
// provider, and the app's Sign out.

import { $ } from './dom.js';

/** What the app closes when it is left (its socket). */
let leave = () => {};
export function onLeave(fn) { leave = fn; }

/** Shows the sign-in page instead of the app (`leave` closes what the app had open). */
export function showSignIn() {
  leave();
  $('app').hidden = true;
  $('signin').hidden = false;
  $('signin-token').focus();
  offerProviderSignIn();
}

/** "Sign in with …" when the gateway has an identity provider (GET /auth/oidc). */
async function offerProviderSignIn() {
  let about = null;
  try {
    const res = await fetch('/auth/oidc', { credentials: 'same-origin' });
    if (res.ok) about = await res.json();
  } catch { /* offline: the token form still works */ }
  if (typeof about?.label !== 'string') return;
  $('signin-oidc').textContent = `Sign in with ${about.label}`;
  $('signin-oidc-row').hidden = false;
  $('signin-oidc').focus();
}

// The form posts the token to /auth/login (never in a URL). Submitting it with fetch keeps a refusal
// on this page; without JavaScript the browser posts the form itself.
$('signin-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const input = $('signin-token');
  const error = $('signin-error');
  const token = input.value.trim();
  if (!token) return;
  error.hidden = true;
  let res;
  try {
    res = await fetch('/auth/login', {
      method: 'POST', credentials: 'same-origin', redirect: 'manual',
      headers: { Accept: 'application/json' }, body: new URLSearchParams({ token }),
    });
  } catch {
    error.textContent = 'The gateway did not answer; try again.';
    error.hidden = false;
    return;
  }
  // 303 to / with the cookie set: an opaque redirect to fetch.
  if (res.type === 'opaqueredirect' || res.ok) {
    input.value = '';
    location.replace('/');
    return;
  }
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (typeof body.error === 'string') message = body.error;
  } catch { /* not JSON */ }
  error.textContent = message;
  error.hidden = false;
  input.select();
});

$('logout').addEventListener('click', async () => {
  let redirect = null;
  try {
    const res = await fetch('/auth/logout', { method: 'POST', credentials: 'same-origin' });
    // A sign-in through the identity provider: its own sign-out page comes next.
    if (res.status === 200) redirect = (await res.json())?.redirect;
  } catch { /* offline */ }
  if (typeof redirect === 'string' && /^https?:\/\//i.test(redirect)) {
    location.assign(redirect);
    return;
  }
  showSignIn();
});
