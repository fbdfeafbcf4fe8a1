// The web UI's service worker: it shows the gateway's Web Push notifications (a permission
// request, a question, a finished or failed turn in a session no tab shows) and opens the session
// when one is tapped. It has no fetch handler and caches nothing: no user data lands in a cache.

const TITLES = {
  permission: 'The agent asks for your permission',
  elicitation: 'The agent has a question for you',
  turn_ended: 'The agent finished its turn',
  turn_failed: 'The turn stopped',
};

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('push', (event) => {
  let data = {};
  try { data = event.data?.json() ?? {}; } catch { /* not ours */ }
  const session = typeof data.sessionId === 'string' ? data.sessionId : '';
  const text = (v) => (typeof v === 'string' ? v : '');
  const body = [text(data.title), text(data.asked)].filter(Boolean).join(' — ');
  event.waitUntil(self.registration.showNotification(TITLES[data.kind] ?? 'ACP Gateway', {
    body,
    tag: session || undefined, // one per session: the newest replaces the rest
    renotify: !!session,
    requireInteraction: data.kind === 'permission' || data.kind === 'elicitation',
    data: { url: `/?session=${encodeURIComponent(session)}` },
  }));
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const url = new URL(event.notification.data?.url ?? '/', self.location.origin);
  if (url.origin !== self.location.origin) return;
  event.waitUntil((async () => {
    const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
    const open = windows.find((w) => new URL(w.url).origin === url.origin);
    if (open) {
      await open.focus();
      open.postMessage({ type: 'open-session', sessionId: url.searchParams.get('session') });
    } else {
      await self.clients.openWindow(url.href);
    }
  })());
});
