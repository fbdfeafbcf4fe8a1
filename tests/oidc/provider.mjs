// A small but real OpenID Connect provider for acp-gateway's tests, built on
// oidc-provider (panva). See README.md beside this file for the env vars, the
// control routes under /__test/ and the page selectors.
//
// stdout carries exactly one JSON line, printed once the server listens:
//   {"issuer":"http://127.0.0.1:PORT","port":PORT,"kid":"<signing kid>"}
// Everything else (oidc-provider's notices included) goes to stderr.

import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';

import { esc, loginPage, logoutSource, page, postLogoutSuccessSource, renderError } from './pages.mjs';

// oidc-provider prints its notices with console.info (stdout); keep stdout
// for the single JSON line. This must run before oidc-provider is loaded.
for (const name of ['log', 'info', 'debug']) {
  console[name] = (...args) => console.error(...args);
}

const { default: Provider, errors } = await import('oidc-provider');

// ---------------------------------------------------------------- config --

function fail(message) {
  process.stderr.write(`provider.mjs: ${message}\n`);
  process.exit(2);
}

function envInt(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < 0) fail(`${name} must be a non-negative integer`);
  return value;
}

const PORT = envInt('OIDC_PORT', 0);
const RESOURCE = process.env.OIDC_RESOURCE || undefined;
const RESOURCE_SCOPES = process.env.OIDC_RESOURCE_SCOPES || 'api';
const KEYS_DIR = process.env.OIDC_KEYS_DIR || undefined;
const CONFORM_ID_TOKEN_CLAIMS = ['1', 'true', 'yes'].includes((process.env.OIDC_CONFORM_ID_TOKEN_CLAIMS || '').toLowerCase());
// OIDC_ISSUER_TRAILING_SLASH: the issuer ends in `/`, as Auth0's does (`https://TENANT.auth0.com/`).
const ISSUER_SLASH = ['1', 'true', 'yes'].includes((process.env.OIDC_ISSUER_TRAILING_SLASH || '').toLowerCase());
const ACCESS_TOKEN_TTL = envInt('OIDC_ACCESS_TOKEN_TTL', 600) || 600;
const ID_TOKEN_TTL = envInt('OIDC_ID_TOKEN_TTL', 3600) || 3600;
const ROTATE_REFRESH = !['0', 'false', 'no'].includes((process.env.OIDC_REFRESH_ROTATION || '').toLowerCase());

if (RESOURCE !== undefined) {
  let url;
  try {
    url = new URL(RESOURCE);
  } catch {
    fail('OIDC_RESOURCE must be an absolute URI');
  }
  if (url.hash) fail('OIDC_RESOURCE must not have a fragment');
}

function parseClients() {
  let raw;
  try {
    raw = JSON.parse(process.env.OIDC_CLIENTS || '[]');
  } catch (err) {
    fail(`OIDC_CLIENTS is not JSON: ${err.message}`);
  }
  if (!Array.isArray(raw)) fail('OIDC_CLIENTS must be a JSON array');
  return raw.map((c, i) => {
    if (!c || typeof c !== 'object' || typeof c.client_id !== 'string' || !c.client_id) {
      fail(`OIDC_CLIENTS[${i}] needs a client_id string`);
    }
    if (!Array.isArray(c.redirect_uris) || c.redirect_uris.length === 0) {
      fail(`OIDC_CLIENTS[${i}] needs a non-empty redirect_uris array`);
    }
    // Anything else the test passes (e.g. id_token_signed_response_alg) is
    // handed to oidc-provider unchanged.
    const { client_secret: secret, ...rest } = c;
    const confidential = typeof secret === 'string' && secret.length > 0;
    return {
      grant_types: confidential
        ? ['authorization_code', 'refresh_token', 'client_credentials']
        : ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: confidential ? 'client_secret_basic' : 'none',
      ...rest,
      ...(confidential ? { client_secret: secret } : {}),
    };
  });
}

const CLIENTS = parseClients();

// -------------------------------------------------------------- accounts --

// Fixed accounts; groups can be changed at run time by POST /__test/groups, the e-mail
// address (and whether it is verified) by POST /__test/email.
const ACCOUNTS = new Map([
  ['alice', {
    email: 'alice@example.com', preferred_username: 'alice', name: 'Alice Example', groups: ['devs'],
  }],
  ['bob', {
    email: 'bob@example.com', preferred_username: 'bob', name: 'Bob Example', groups: ['devs'],
  }],
  ['carol', {
    email: 'carol@other.example', preferred_username: 'carol', name: 'Carol Other', groups: ['sales'],
  }],
]);

async function findAccount(_ctx, sub) {
  if (!ACCOUNTS.has(sub)) return undefined;
  return {
    accountId: sub,
    // Read at call time, so a refresh after /__test/groups sees the new groups.
    async claims() {
      const a = ACCOUNTS.get(sub);
      return {
        sub,
        name: a.name,
        preferred_username: a.preferred_username,
        email: a.email,
        email_verified: a.email_verified ?? true,
        groups: [...a.groups],
      };
    },
  };
}

// ------------------------------------------------------------------ keys --

let signingKeys = []; // newest (the signing key) first: { kid, jwk }

function newSigningKey() {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const kid = crypto.randomBytes(12).toString('base64url');
  const jwk = {
    ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig',
  };
  if (KEYS_DIR) {
    fs.mkdirSync(KEYS_DIR, { recursive: true });
    fs.writeFileSync(
      path.join(KEYS_DIR, `${kid}.pem`),
      privateKey.export({ type: 'pkcs8', format: 'pem' }),
      { mode: 0o600 },
    );
    fs.writeFileSync(path.join(KEYS_DIR, `${kid}.json`), `${JSON.stringify({
      kid, alg: 'RS256', publicPem: publicKey.export({ type: 'spki', format: 'pem' }),
    })}\n`);
  }
  return { kid, jwk };
}

// --------------------------------------------------------------- storage --

// One store shared by every Provider instance (a key rotation builds a new
// instance): sessions, interactions, grants, codes and tokens survive it.
// Unlike oidc-provider's own memory adapter it has no size cap.
const store = new Map(); // "Model:id" -> { payload, expiresAt }
const grantIndex = new Map(); // grantId -> Set of "Model:id"
const sessionUids = new Map(); // session uid -> id
const userCodes = new Map(); // user code -> id

function live(key) {
  const entry = store.get(key);
  if (!entry) return undefined;
  if (entry.expiresAt <= Date.now()) {
    store.delete(key);
    return undefined;
  }
  return entry;
}

class SharedMemoryAdapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    const expiresAt = typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : Infinity;
    store.set(key, { payload: structuredClone(payload), expiresAt });
    if (payload.grantId) {
      if (!grantIndex.has(payload.grantId)) grantIndex.set(payload.grantId, new Set());
      grantIndex.get(payload.grantId).add(key);
    }
    if (this.model === 'Session' && payload.uid) sessionUids.set(payload.uid, id);
    if (payload.userCode) userCodes.set(payload.userCode, id);
  }

  async find(id) {
    const entry = live(this.key(id));
    return entry ? structuredClone(entry.payload) : undefined;
  }

  async findByUid(uid) {
    const id = sessionUids.get(uid);
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = userCodes.get(userCode);
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const entry = live(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    for (const key of grantIndex.get(grantId) ?? []) store.delete(key);
    grantIndex.delete(grantId);
  }
}

setInterval(() => {
  const now = Date.now();
  for (const [key, entry] of store) if (entry.expiresAt <= now) store.delete(key);
  for (const [grantId, keys] of grantIndex) {
    for (const key of keys) if (!store.has(key)) keys.delete(key);
    if (keys.size === 0) grantIndex.delete(grantId);
  }
  for (const [uid, id] of sessionUids) if (!store.has(`Session:${id}`)) sessionUids.delete(uid);
  for (const [code, id] of userCodes) if (!store.has(`DeviceCode:${id}`)) userCodes.delete(code);
}, 60_000).unref();

// -------------------------------------------------------------- provider --

let issuer; // set once listening
let current; // { provider, handler }
const cookieKeys = [crypto.randomBytes(32).toString('base64url')];
let jwksMaxAge = 300;
let jwksRequests = 0;

function configuration() {
  return {
    adapter: SharedMemoryAdapter,
    clients: CLIENTS,
    jwks: { keys: signingKeys.map((k) => k.jwk) },
    findAccount,
    claims: {
      openid: ['sub'],
      profile: ['name', 'preferred_username'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    scopes: ['openid', 'offline_access'],
    responseTypes: ['code'],
    // Put the scope's claims (groups among them) in the ID token itself, unless
    // OIDC_CONFORM_ID_TOKEN_CLAIMS asks for the library's default (only at userinfo).
    conformIdTokenClaims: CONFORM_ID_TOKEN_CLAIMS,
    cookies: {
      // Cookies ignore ports: distinct names so a gateway on another port of
      // 127.0.0.1 cannot clash with them.
      names: { session: 'op_session', interaction: 'op_interaction', resume: 'op_interaction_resume' },
      keys: cookieKeys,
      long: { httpOnly: true, sameSite: 'lax' },
      short: { httpOnly: true, sameSite: 'lax' },
    },
    pkce: { required: () => true },
    issueRefreshToken: async (ctx, client, source) => client.grantTypeAllowed('refresh_token')
      && (ctx.oidc.params?.grant_type === 'authorization_code' || source.scopes.has('offline_access')),
    rotateRefreshToken: () => ROTATE_REFRESH,
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      userinfo: { enabled: true },
      rpInitiatedLogout: { enabled: true, logoutSource, postLogoutSuccessSource },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (_ctx, _client, oneOf) => oneOf,
        // A resource asked for in the authorization request is used at the
        // token endpoint too, without repeating `resource` there.
        useGrantedResource: async () => true,
        getResourceServerInfo: async (_ctx, indicator) => {
          if (RESOURCE === undefined || indicator !== RESOURCE) throw new errors.InvalidTarget();
          return {
            scope: RESOURCE_SCOPES,
            audience: RESOURCE,
            accessTokenTTL: ACCESS_TOKEN_TTL,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    renderError,
    ttl: {
      AccessToken: ACCESS_TOKEN_TTL,
      ClientCredentials: ACCESS_TOKEN_TTL,
      AuthorizationCode: 60,
      IdToken: ID_TOKEN_TTL,
      RefreshToken: 24 * 60 * 60,
      Interaction: 60 * 60,
      Session: 24 * 60 * 60,
      Grant: 24 * 60 * 60,
    },
  };
}

function buildProvider() {
  const provider = new Provider(issuer, configuration());
  // The JWKS route: count it and answer with the configured Cache-Control.
  const jwksPath = new URL(provider.urlFor('jwks')).pathname;
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.path === jwksPath && (ctx.method === 'GET' || ctx.method === 'HEAD')) {
      jwksRequests += 1;
      if (ctx.status === 200) ctx.set('Cache-Control', `max-age=${jwksMaxAge}`);
    }
  });
  for (const event of [
    'server_error', 'authorization.error', 'grant.error', 'end_session.error',
    'userinfo.error', 'introspection.error', 'revocation.error', 'jwks.error', 'discovery.error',
  ]) {
    provider.on(event, (...args) => {
      const err = args.find((a) => a instanceof Error);
      console.error(`oidc ${event}: ${err ? `${err.message}${err.error_description ? ` (${err.error_description})` : ''}` : ''}`);
      if (event === 'server_error' && err) console.error(err.stack);
    });
  }
  return { provider, handler: provider.callback() };
}

// ---------------------------------------------------------- http helpers --

const MAX_BODY = 64 * 1024;

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) {
        reject(Object.assign(new Error('body too large'), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function send(res, status, body, type) {
  const buf = Buffer.from(body);
  res.writeHead(status, {
    'Content-Type': type,
    'Content-Length': buf.length,
    'Cache-Control': 'no-store',
  });
  res.end(buf);
}

const sendJson = (res, status, value) => send(res, status, `${JSON.stringify(value)}\n`, 'application/json');
const sendHtml = (res, status, html) => send(res, status, html, 'text/html; charset=utf-8');

function isLoopback(addr) {
  return addr === '::1' || addr?.startsWith('127.') || addr?.startsWith('::ffff:127.');
}

// ----------------------------------------------------------- /__test/... --

async function testRoute(req, res, pathname) {
  if (!isLoopback(req.socket.remoteAddress)) return sendJson(res, 403, { error: 'loopback only' });

  let body = {};
  if (req.method === 'POST') {
    const text = await readBody(req);
    if (text.trim()) {
      try {
        body = JSON.parse(text);
      } catch {
        return sendJson(res, 400, { error: 'body is not JSON' });
      }
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
      return sendJson(res, 400, { error: 'body must be a JSON object' });
    }
  }

  const route = `${req.method} ${pathname}`;
  switch (route) {
    case 'POST /__test/groups': {
      const account = ACCOUNTS.get(body.user);
      if (!account) return sendJson(res, 404, { error: `unknown user ${body.user}` });
      if (!Array.isArray(body.groups) || !body.groups.every((g) => typeof g === 'string')) {
        return sendJson(res, 400, { error: 'groups must be an array of strings' });
      }
      account.groups = [...body.groups];
      console.error(`groups of ${body.user} are now ${JSON.stringify(account.groups)}`);
      return sendJson(res, 200, { user: body.user, groups: account.groups });
    }
    case 'POST /__test/email': {
      // As a provider that lets people type any address into their profile.
      const account = ACCOUNTS.get(body.user);
      if (!account) return sendJson(res, 404, { error: `unknown user ${body.user}` });
      if (typeof body.email !== 'string' || typeof body.email_verified !== 'boolean') {
        return sendJson(res, 400, { error: 'email must be a string and email_verified a boolean' });
      }
      account.email = body.email;
      account.email_verified = body.email_verified;
      console.error(`email of ${body.user} is now ${body.email} (verified: ${body.email_verified})`);
      return sendJson(res, 200, { user: body.user, email: account.email, email_verified: account.email_verified });
    }
    case 'POST /__test/rotate': {
      const key = newSigningKey();
      signingKeys = body.drop_old === true ? [key] : [key, ...signingKeys];
      current = buildProvider();
      const kids = signingKeys.map((k) => k.kid);
      console.error(`rotated: signing kid ${key.kid}, JWKS ${JSON.stringify(kids)}`);
      return sendJson(res, 200, { kid: key.kid, kids });
    }
    case 'GET /__test/stats':
      return sendJson(res, 200, { jwks_requests: jwksRequests });
    case 'POST /__test/jwks-cache': {
      if (!Number.isSafeInteger(body.max_age) || body.max_age < 0) {
        return sendJson(res, 400, { error: 'max_age must be a non-negative integer' });
      }
      jwksMaxAge = body.max_age;
      return sendJson(res, 200, { max_age: jwksMaxAge });
    }
    default:
      return sendJson(res, 404, { error: `no test route ${route}` });
  }
}

// ------------------------------------------------------- /interaction/... --

async function grantFromPrompt(provider, details) {
  const { prompt: { details: missing }, grantId, session, params } = details;
  const grant = grantId
    ? await provider.Grant.find(grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  if (missing.missingResourceScopes) {
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes)) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
  }
  return grant.save();
}

async function interactionRoute(req, res, pathname) {
  const match = /^\/interaction\/([A-Za-z0-9_-]+)(?:\/(login|abort))?$/.exec(pathname);
  if (!match) return sendHtml(res, 404, page('Not found', '<h1>Not found</h1>'));
  const [, uid, action] = match;
  const { provider } = current;

  let details;
  try {
    details = await provider.interactionDetails(req, res);
  } catch (err) {
    return sendHtml(res, 400, page('Error', `<h1>Error</h1>\n<p class="error">${esc(err.message)}</p>`));
  }
  if (details.uid !== uid) {
    return sendHtml(res, 400, page('Error', '<h1>Error</h1>\n<p class="error">interaction mismatch</p>'));
  }
  const { prompt, params } = details;

  if (action === 'abort') {
    return provider.interactionFinished(req, res, {
      error: 'access_denied', error_description: 'End-User aborted interaction',
    }, { mergeWithLastSubmission: false });
  }

  if (prompt.name === 'consent') {
    // Consent is granted at once for every configured client: no page.
    const grantId = await grantFromPrompt(provider, details);
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }

  if (prompt.name !== 'login') {
    return sendHtml(res, 501, page('Error', `<h1>Error</h1>\n<p class="error">prompt ${esc(prompt.name)} not implemented</p>`));
  }

  if (action === 'login' && req.method === 'POST') {
    const form = new URLSearchParams(await readBody(req));
    const login = (form.get('login') ?? '').trim();
    const password = form.get('password') ?? '';
    if (!ACCOUNTS.has(login) || password.length === 0) {
      console.error(`login refused for ${JSON.stringify(login)}`);
      return sendHtml(res, 200, loginPage({
        uid, clientId: params.client_id, login, error: 'Invalid login or password.',
      }));
    }
    console.error(`login accepted for ${login}`);
    return provider.interactionFinished(req, res, {
      login: { accountId: login, amr: ['pwd'] },
    }, { mergeWithLastSubmission: false });
  }

  if (req.method !== 'GET' && req.method !== 'HEAD') {
    return sendHtml(res, 405, page('Error', '<h1>Method not allowed</h1>'));
  }
  return sendHtml(res, 200, loginPage({ uid, clientId: params.client_id, loginHint: params.login_hint }));
}

// ---------------------------------------------------------------- server --

const server = http.createServer(async (req, res) => {
  try {
    const { pathname } = new URL(req.url, 'http://127.0.0.1');
    if (pathname.startsWith('/__test/')) return await testRoute(req, res, pathname);
    if (pathname === '/interaction' || pathname.startsWith('/interaction/')) {
      return await interactionRoute(req, res, pathname);
    }
    return current.handler(req, res);
  } catch (err) {
    console.error('request failed:', err);
    if (!res.headersSent) sendJson(res, err.status || 500, { error: err.message });
    else res.destroy();
  }
  return undefined;
});
server.keepAliveTimeout = 5_000;

server.on('error', (err) => fail(`server error: ${err.message}`));
server.listen(PORT, '127.0.0.1', () => {
  const { port } = server.address();
  issuer = `http://127.0.0.1:${port}${ISSUER_SLASH ? '/' : ''}`;
  signingKeys = [newSigningKey()];
  current = buildProvider();
  process.stdout.write(`${JSON.stringify({ issuer, port, kid: signingKeys[0].kid })}\n`);
  console.error(`oidc test provider listening at ${issuer}, clients: ${CLIENTS.map((c) => c.client_id).join(', ') || '(none)'}`);
});

let stopping = false;
function stop(signal) {
  if (stopping) return;
  stopping = true;
  console.error(`${signal}: stopping`);
  server.close(() => process.exit(0));
  server.closeAllConnections();
  setTimeout(() => process.exit(0), 2_000).unref();
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));

// Do not outlive the process that started us (a test that died without
// stopping us): once the parent is gone we are re-parented. OIDC_WATCH_PARENT=0
// turns this off.
if (!['0', 'false', 'no'].includes((process.env.OIDC_WATCH_PARENT || '').toLowerCase())) {
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) stop('parent gone');
  }, 1_000).unref();
}
