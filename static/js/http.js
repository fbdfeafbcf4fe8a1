// The web UI's REST calls (`api`) and relative times for the session list.

const relFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
const UNITS = [['year', 31536000], ['month', 2592000], ['week', 604800], ['day', 86400], ['hour', 3600], ['minute', 60]];

/** "5 minutes ago" for an ISO time ('' when it is not one). */
export function relativeTime(iso) {
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return '';
  const seconds = (then - Date.now()) / 1000;
  for (const [unit, size] of UNITS) {
    if (Math.abs(seconds) >= size) return relFormat.format(Math.round(seconds / size), unit);
  }
  return 'just now';
}

export class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

/** What a 401 does (shows the sign-in page); set once by the app. */
let unauthorized = () => {};
export function onUnauthorized(fn) { unauthorized = fn; }

/** `method path` with a JSON `body` (if any) through [`api`]: the JSON answer, or null. */
export function send(method, path, body) {
  const options = { method };
  if (body !== undefined) {
    options.headers = { Accept: 'application/json', 'Content-Type': 'application/json' };
    options.body = JSON.stringify(body);
  }
  return api(path, options);
}

/** Same-origin JSON fetch; the HttpOnly cookie carries the auth. A 401 shows the sign-in panel. */
export async function api(path, options = {}) {
  const res = await fetch(path, { credentials: 'same-origin', headers: { Accept: 'application/json' }, ...options });
  if (res.status === 401) {
    unauthorized();
    throw new HttpError(401, 'not signed in');
  }
  if (!res.ok) {
    let message = `${res.status} ${res.statusText}`;
    try {
      const body = await res.json();
      const detail = body.error?.message ?? body.error ?? body.message;
      if (typeof detail === 'string' && detail) message = detail;
    } catch { /* body was not JSON */ }
    throw new HttpError(res.status, message);
  }
  return res.status === 204 ? null : res.json();
}
