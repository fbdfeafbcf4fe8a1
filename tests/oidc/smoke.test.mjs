// End-to-end smoke test of provider.mjs with plain fetch (no browser).
// Run: cd tests/oidc && node --test

import { strict as assert } from 'node:assert';
import { spawn } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CLIENT_ID = 'gateway';
const CLIENT_SECRET = 'gateway-secret';
const REDIRECT_URI = 'http://127.0.0.1:9/cb';
const POST_LOGOUT_URI = 'http://127.0.0.1:9/signed-out';
const RESOURCE = 'http://gateway.test';
const BASIC = `Basic ${Buffer.from(`${CLIENT_ID}:${CLIENT_SECRET}`).toString('base64')}`;

let child;
let stderr = '';
let stdout = '';
let issuer;
let startKid;
let keysDir;
let discovery;

// ---------------------------------------------------------------- helpers --

function decodeJwt(jwt) {
  const [h, p] = jwt.split('.');
  return {
    header: JSON.parse(Buffer.from(h, 'base64url')),
    payload: JSON.parse(Buffer.from(p, 'base64url')),
  };
}

async function jwks() {
  const res = await fetch(discovery.jwks_uri);
  assert.equal(res.status, 200);
  return { body: await res.json(), cacheControl: res.headers.get('cache-control') };
}

function verifyWith(jwt, jwk) {
  const [h, p, s] = jwt.split('.');
  return crypto.verify('sha256', Buffer.from(`${h}.${p}`), crypto.createPublicKey({ key: jwk, format: 'jwk' }), Buffer.from(s, 'base64url'));
}

async function verifyJwt(jwt) {
  const { header } = decodeJwt(jwt);
  const { body } = await jwks();
  const jwk = body.keys.find((k) => k.kid === header.kid);
  assert.ok(jwk, `kid ${header.kid} is in the JWKS`);
  assert.ok(verifyWith(jwt, jwk), 'signature verifies with the JWKS key');
  return decodeJwt(jwt);
}

async function control(method, route, body) {
  const res = await fetch(`${issuer}${route}`, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  assert.equal(res.status, 200, `${method} ${route}`);
  return res.json();
}

async function stats() {
  return (await control('GET', '/__test/stats')).jwks_requests;
}

async function token(params) {
  const res = await fetch(discovery.token_endpoint, {
    method: 'POST',
    headers: { authorization: BASIC, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams(params),
  });
  const json = await res.json();
  assert.equal(res.status, 200, `token endpoint: ${JSON.stringify(json)}`);
  return json;
}

// A cookie jar good enough for one host: name -> value.
class Jar {
  cookies = new Map();

  store(res) {
    for (const line of res.headers.getSetCookie()) {
      const [pair, ...attrs] = line.split(';');
      const eq = pair.indexOf('=');
      const name = pair.slice(0, eq).trim();
      const value = pair.slice(eq + 1).trim();
      const expired = attrs.some((a) => /^\s*expires=/i.test(a) && Date.parse(a.split('=')[1]) < Date.now())
        || attrs.some((a) => /^\s*max-age=\s*0\s*$/i.test(a));
      if (expired || value === '') this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
  }

  header() {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
  }
}

// Fetch, following redirects by hand (keeping cookies) until a page answers or
// the redirect leaves for one of the client's URIs.
async function browse(jar, url, init = {}) {
  let next = url;
  let options = init;
  for (let hops = 0; hops < 10; hops += 1) {
    const res = await fetch(next, {
      ...options,
      redirect: 'manual',
      headers: { ...options.headers, cookie: jar.header() },
    });
    jar.store(res);
    if (res.status < 300 || res.status >= 400) {
      return { url: next, status: res.status, html: await res.text() };
    }
    const location = new URL(res.headers.get('location'), next).href;
    await res.arrayBuffer();
    if (!location.startsWith(issuer)) return { redirect: location };
    next = location;
    options = {};
  }
  throw new Error('too many redirects');
}

const unescape = (s) => s.replaceAll('&quot;', '"').replaceAll('&#39;', "'").replaceAll('&lt;', '<')
  .replaceAll('&gt;', '>').replaceAll('&amp;', '&');

function parseForm(html, pageUrl) {
  const form = /<form\b[^>]*>/i.exec(html);
  assert.ok(form, `a form on the page:\n${html}`);
  const action = /\baction="([^"]*)"/i.exec(form[0])[1];
  const fields = {};
  for (const input of html.matchAll(/<input\b[^>]*>/gi)) {
    const name = /\bname="([^"]*)"/i.exec(input[0]);
    const value = /\bvalue="([^"]*)"/i.exec(input[0]);
    if (name) fields[name[1]] = value ? unescape(value[1]) : '';
  }
  return { action: new URL(unescape(action), pageUrl).href, fields };
}

function pkce() {
  const verifier = crypto.randomBytes(32).toString('base64url');
  const challenge = crypto.createHash('sha256').update(verifier).digest('base64url');
  return { verifier, challenge };
}

function authorizeUrl(extra) {
  const url = new URL(discovery.authorization_endpoint);
  for (const [k, v] of Object.entries({
    client_id: CLIENT_ID,
    response_type: 'code',
    redirect_uri: REDIRECT_URI,
    scope: 'openid profile email groups offline_access',
    ...extra,
  })) url.searchParams.set(k, v);
  return url.href;
}

// ------------------------------------------------------------------ tests --

describe('oidc test provider', { timeout: 20_000 }, () => {
  before(async () => {
    keysDir = fs.mkdtempSync(path.join(os.tmpdir(), 'oidc-keys-'));
    child = spawn(process.execPath, [path.join(HERE, 'provider.mjs')], {
      env: {
        ...process.env,
        OIDC_PORT: '0',
        OIDC_RESOURCE: RESOURCE,
        OIDC_KEYS_DIR: keysDir,
        OIDC_CLIENTS: JSON.stringify([{
          client_id: CLIENT_ID,
          client_secret: CLIENT_SECRET,
          redirect_uris: [REDIRECT_URI],
          post_logout_redirect_uris: [POST_LOGOUT_URI],
        }]),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stderr.on('data', (d) => { stderr += d; });
    let timer;
    const line = await new Promise((resolve, reject) => {
      child.stdout.on('data', (d) => {
        stdout += d;
        if (stdout.includes('\n')) resolve(stdout.slice(0, stdout.indexOf('\n')));
      });
      child.on('exit', (code) => reject(new Error(`provider exited (${code}):\n${stderr}`)));
      timer = setTimeout(() => reject(new Error(`provider did not start:\n${stderr}`)), 10_000);
    }).finally(() => clearTimeout(timer));
    const started = JSON.parse(line);
    assert.equal(started.issuer, `http://127.0.0.1:${started.port}`);
    issuer = started.issuer;
    startKid = started.kid;
  });

  after(() => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    fs.rmSync(keysDir, { recursive: true, force: true });
  });

  it('serves a discovery document with the endpoints a relying party needs', async () => {
    const res = await fetch(`${issuer}/.well-known/openid-configuration`);
    assert.equal(res.status, 200);
    discovery = await res.json();
    assert.equal(discovery.issuer, issuer);
    for (const key of ['authorization_endpoint', 'token_endpoint', 'jwks_uri', 'end_session_endpoint', 'userinfo_endpoint']) {
      assert.ok(discovery[key]?.startsWith(`${issuer}/`), `${key}: ${discovery[key]}`);
    }
    assert.deepEqual(discovery.code_challenge_methods_supported, ['S256']);
    assert.ok(discovery.scopes_supported.includes('groups'));
  });

  it('writes the signing key to OIDC_KEYS_DIR and publishes it', async () => {
    const meta = JSON.parse(fs.readFileSync(path.join(keysDir, `${startKid}.json`), 'utf8'));
    assert.equal(meta.kid, startKid);
    assert.equal(meta.alg, 'RS256');
    const priv = crypto.createPrivateKey(fs.readFileSync(path.join(keysDir, `${startKid}.pem`)));
    const { body } = await jwks();
    assert.deepEqual(body.keys.map((k) => k.kid), [startKid]);
    const published = crypto.createPublicKey({ key: body.keys[0], format: 'jwk' });
    assert.equal(published.export({ type: 'spki', format: 'pem' }), meta.publicPem);
    assert.equal(crypto.createPublicKey(priv).export({ type: 'spki', format: 'pem' }), meta.publicPem);
  });

  it('issues a JWT access token for the resource on client_credentials', async () => {
    const res = await token({ grant_type: 'client_credentials', resource: RESOURCE });
    assert.equal(res.token_type, 'Bearer');
    const { header, payload } = await verifyJwt(res.access_token);
    assert.equal(header.kid, startKid);
    assert.equal(header.alg, 'RS256');
    assert.equal(payload.aud, RESOURCE);
    assert.equal(payload.iss, issuer);
    assert.equal(payload.client_id, CLIENT_ID);
  });

  let refreshToken;
  let idToken;
  let jar;

  it('runs the authorization code flow with PKCE through the login form', async () => {
    jar = new Jar();
    const { verifier, challenge } = pkce();
    const state = crypto.randomBytes(8).toString('hex');
    const nonce = crypto.randomBytes(8).toString('hex');

    // PKCE is required.
    const noPkce = await browse(new Jar(), authorizeUrl({ state }));
    assert.match(noPkce.redirect, /^http:\/\/127\.0\.0\.1:9\/cb\?error=invalid_request/);

    let pageRes = await browse(jar, authorizeUrl({
      state, nonce, code_challenge: challenge, code_challenge_method: 'S256',
    }));
    assert.equal(pageRes.status, 200);
    assert.match(pageRes.html, /<input type="text" name="login"/);
    assert.match(pageRes.html, /<input type="password" name="password"/);
    assert.match(pageRes.html, /<button type="submit" id="sign-in">Sign in<\/button>/);

    // An unknown login is refused on the login page itself.
    let form = parseForm(pageRes.html, pageRes.url);
    pageRes = await browse(jar, form.action, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ login: 'mallory', password: 'x' }),
    });
    assert.equal(pageRes.status, 200);
    assert.match(pageRes.html, /id="error"[^>]*>Invalid login or password/);

    form = parseForm(pageRes.html, pageRes.url);
    const done = await browse(jar, form.action, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ login: 'alice', password: 'anything' }),
    });
    assert.ok(done.redirect?.startsWith(`${REDIRECT_URI}?`), `redirected to the client: ${JSON.stringify(done)}`);
    const back = new URL(done.redirect).searchParams;
    assert.equal(back.get('state'), state);
    assert.equal(back.get('iss'), issuer);
    assert.ok(back.get('code'));

    const res = await token({
      grant_type: 'authorization_code', code: back.get('code'), redirect_uri: REDIRECT_URI, code_verifier: verifier,
    });
    assert.ok(res.refresh_token, 'a refresh token is issued');
    // oidc-provider keeps offline_access only with prompt=consent (OIDC Core).
    assert.equal(res.scope, 'openid profile email groups');
    const { payload } = await verifyJwt(res.id_token);
    assert.equal(payload.sub, 'alice');
    assert.equal(payload.aud, CLIENT_ID);
    assert.equal(payload.nonce, nonce);
    assert.equal(payload.email, 'alice@example.com');
    assert.equal(payload.preferred_username, 'alice');
    assert.deepEqual(payload.groups, ['devs']);
    refreshToken = res.refresh_token;
    idToken = res.id_token;

    // With the session cookie a second authorization needs no login page.
    const again = await browse(jar, authorizeUrl({ code_challenge: pkce().challenge, code_challenge_method: 'S256' }));
    assert.ok(again.redirect?.includes('code='), JSON.stringify(again));
  });

  it('gives the current groups on the next refresh', async () => {
    await control('POST', '/__test/groups', { user: 'alice', groups: ['sales'] });
    const res = await token({ grant_type: 'refresh_token', refresh_token: refreshToken });
    const { payload } = await verifyJwt(res.id_token);
    assert.deepEqual(payload.groups, ['sales']);
    assert.ok(res.refresh_token && res.refresh_token !== refreshToken, 'the refresh token rotates');
    refreshToken = res.refresh_token;
    idToken = res.id_token;
  });

  it('rotates the signing key and keeps refresh working', async () => {
    const rotated = await control('POST', '/__test/rotate', { drop_old: false });
    assert.notEqual(rotated.kid, startKid);
    assert.deepEqual(rotated.kids, [rotated.kid, startKid]);
    assert.ok(fs.existsSync(path.join(keysDir, `${rotated.kid}.pem`)));
    assert.ok(fs.existsSync(path.join(keysDir, `${rotated.kid}.json`)));
    const { body } = await jwks();
    assert.deepEqual(body.keys.map((k) => k.kid), [rotated.kid, startKid]);

    const cc = await token({ grant_type: 'client_credentials', resource: RESOURCE });
    assert.equal(decodeJwt(cc.access_token).header.kid, rotated.kid);

    const res = await token({ grant_type: 'refresh_token', refresh_token: refreshToken });
    const { header } = await verifyJwt(res.id_token);
    assert.equal(header.kid, rotated.kid);
    refreshToken = res.refresh_token;
    idToken = res.id_token;
  });

  it('ends the session with id_token_hint and post_logout_redirect_uri', async () => {
    const url = new URL(discovery.end_session_endpoint);
    url.searchParams.set('id_token_hint', idToken);
    url.searchParams.set('post_logout_redirect_uri', POST_LOGOUT_URI);
    url.searchParams.set('state', 'bye');
    const pageRes = await browse(jar, url.href);
    assert.equal(pageRes.status, 200);
    const form = parseForm(pageRes.html, pageRes.url);
    assert.equal(form.fields.logout, 'yes');
    assert.ok(form.fields.xsrf);
    const done = await browse(jar, form.action, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(form.fields),
    });
    assert.equal(done.redirect, `${POST_LOGOUT_URI}?state=bye`);

    // offline_access was dropped (no prompt=consent), so the refresh token
    // was bound to the session that has just ended.
    const res = await fetch(discovery.token_endpoint, {
      method: 'POST',
      headers: { authorization: BASIC },
      body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: refreshToken }),
    });
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error, 'invalid_grant');

    // The session is gone: the next authorization shows the login page.
    const again = await browse(jar, authorizeUrl({ code_challenge: pkce().challenge, code_challenge_method: 'S256' }));
    assert.equal(again.status, 200);
    assert.match(again.html, /name="login"/);
  });

  it('drops old keys on request, counts JWKS fetches and sets their Cache-Control', async () => {
    const rotated = await control('POST', '/__test/rotate', { drop_old: true });
    assert.deepEqual(rotated.kids, [rotated.kid]);

    const beforeCount = await stats();
    let res = await jwks();
    assert.deepEqual(res.body.keys.map((k) => k.kid), [rotated.kid]);
    assert.equal(res.cacheControl, 'max-age=300');
    await control('POST', '/__test/jwks-cache', { max_age: 2 });
    res = await jwks();
    assert.equal(res.cacheControl, 'max-age=2');
    assert.equal(await stats(), beforeCount + 2);
  });

  it('stops on SIGTERM, having printed one line on stdout', async () => {
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    const [code, signal] = await exited;
    assert.equal(signal, null);
    assert.equal(code, 0);
    assert.equal(stdout.split('\n').length, 2, `stdout: ${stdout}`);
    assert.ok(stdout.endsWith('}\n'));
  });
});
