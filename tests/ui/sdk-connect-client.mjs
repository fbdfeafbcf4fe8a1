// The official TypeScript SDK as an editor (tests/it/editor.rs runs it): spawns
// `acp-gateway connect URL --token T` and speaks ACP v1 to it on stdio: initialize, list, new,
// a streamed prompt with a permission (answered "allow"), list, load replaying the transcript.
// Prints one `KIND json` line per step. Usage: node sdk-connect-client.mjs BIN URL TOKEN CWD [http]
// With `http` it speaks to the gateway's /acp itself over Streamable HTTP (the SDK's
// createHttpStream), the same flow with only the transport changed.
import { spawn } from 'node:child_process';
import { Readable, Writable } from 'node:stream';
import { client, ndJsonStream } from '@agentclientprotocol/sdk';
import { createHttpStream } from '@agentclientprotocol/sdk/experimental/http-client';

const [bin, url, token, cwd, transport] = process.argv.slice(2);
const child = transport === 'http' ? null : spawn(bin, ['connect', url, '--token', token], { stdio: ['pipe', 'pipe', 'inherit'] });
const stream = child
  ? ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout))
  : createHttpStream(`${url}/acp`, { headers: { Authorization: `Bearer ${token}` } });
const out = (kind, value) => process.stdout.write(`${kind} ${JSON.stringify(value)}\n`);
let updates = 0;
const app = client()
  .onNotification('session/update', () => { updates += 1; })
  .onRequest('session/request_permission', ({ params }) => {
    out('PERMISSION', params.options.map((o) => o.optionId));
    const allow = params.options.find((o) => o.kind.startsWith('allow'));
    return allow ? { outcome: { outcome: 'selected', optionId: allow.optionId } } : { outcome: { outcome: 'cancelled' } };
  });
try {
  await app.connectWith(stream, async (ctx) => {
    out('INIT', await ctx.request('initialize', { protocolVersion: 1, clientCapabilities: {} }));
    out('LIST', await ctx.request('session/list', {}));
    const { sessionId } = await ctx.request('session/new', { cwd, mcpServers: [] });
    const result = await ctx.request('session/prompt', { sessionId, prompt: [{ type: 'text', text: 'hello from the TypeScript SDK [permission]' }] });
    out('RESULT', { ...result, streamed: updates });
    out('LIST', await ctx.request('session/list', {}));
    updates = 0;
    await ctx.request('session/load', { sessionId, cwd, mcpServers: [] });
    out('LOADED', { sessionId, replayed: updates });
  });
} finally {
  child?.kill();
}
