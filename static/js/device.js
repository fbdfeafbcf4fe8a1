// The device sign-in page (/device): look a code up, show which device asks, approve or deny.
// The person's own sign-in (the web UI's cookie) is what approves; the program gets its token
// from the gateway when it next polls.

const $ = (id) => document.getElementById(id);

function say(text, state) {
  const status = $('device-status');
  status.textContent = text;
  status.dataset.state = state;
}

async function look(code) {
  $('device-ask').hidden = true;
  const res = await fetch(`/api/device?userCode=${encodeURIComponent(code)}`, { credentials: 'same-origin' });
  if (res.status === 401) {
    say('Sign in to this gateway first (open it in this browser), then open this link again.', 'signed-out');
    return;
  }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    say(body.error || `The code could not be read (${res.status}).`, 'error');
    return;
  }
  if (body.state !== 'pending') {
    const why = { expired: 'This code expired: start the sign-in again on your device.',
      approved: 'This code was approved already.', denied: 'This code was denied.',
      issued: 'This code was used already.' };
    say(why[body.state] || `This code is ${body.state}.`, body.state);
    return;
  }
  $('device-name').textContent = body.clientName;
  $('device-addr').textContent = body.clientAddr || 'an unknown address';
  $('device-when').textContent = new Date(body.createdAt * 1000).toLocaleString();
  $('device-ask').hidden = false;
  say('', 'asking');
  $('device-approve').focus();
  $('device-approve').onclick = () => decide(body.userCode, true);
  $('device-deny').onclick = () => decide(body.userCode, false);
}

async function decide(userCode, approve) {
  const res = await fetch('/api/device/approve', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ userCode, approve }),
  });
  const body = await res.json().catch(() => ({}));
  $('device-ask').hidden = true;
  if (res.ok) {
    say(approve ? 'Approved. Your device is signed in; you can close this page.'
      : 'Denied. The device was not signed in.', body.state);
  } else {
    say(body.error || `That did not work (${res.status}).`, 'error');
  }
}

// Who approves: the person this browser is signed in as.
fetch('/api/me', { credentials: 'same-origin' })
  .then((res) => (res.ok ? res.json() : null))
  .then((me) => { if (me) $('device-who').textContent = `Signed in as ${me.user}.`; })
  .catch(() => {});

const code = new URLSearchParams(location.search).get('code');
$('device-form').addEventListener('submit', (e) => {
  e.preventDefault();
  look($('device-code').value.trim());
});
if (code) {
  $('device-code').value = code;
  look(code);
}
