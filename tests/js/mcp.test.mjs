// The official MCP TypeScript SDK's client (@modelcontextprotocol/sdk) against cellgate's MCP
// server over both transports: stdio (`cellgate mcp`, embedded and --url) and Streamable HTTP
// (`/mcp` on `cellgate serve`).
//
// One gateway for the whole file (temp state dir, random token, port 0). The same scenario —
// state across calls, a matplotlib PNG, an error with isError, files, restart, close — runs
// through each transport; the HTTP-only checks (token, Origin, headers) use fetch directly.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js';
import { servePort } from './serve_port.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = path.join(path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin'), 'cellgate');
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

// ---- the gateway ----------------------------------------------------------------------------

const gw = { proc: null, dir: null, port: 0, token: '', base: '', log: [] };

function logTail(n = 40) {
  return gw.log.join('').split('\n').slice(-n).join('\n');
}

async function startGateway() {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-mcp-js-'));
  gw.token = randomBytes(16).toString('hex');
  gw.proc = spawn(BIN, ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
                        '--state-dir', path.join(gw.dir, 'state')],
                  { stdio: ['ignore', 'pipe', 'pipe'] });
  gw.port = await servePort(gw, logTail);
  gw.base = `http://127.0.0.1:${gw.port}`;
}

async function stopGateway() {
  if (gw.proc && gw.proc.exitCode === null && gw.proc.signalCode === null) {
    gw.proc.kill('SIGTERM');
    const done = await withTimeout(gw.exited, 30_000, 'serve exit after SIGTERM').catch(() => null);
    if (done === null) {
      gw.proc.kill('SIGKILL');
      await gw.exited;
    }
  }
  if (gw.dir) {
    await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  }
}

before(startGateway, { timeout: 40_000 });
after(stopGateway, { timeout: 40_000 });

// ---- helpers --------------------------------------------------------------------------------

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function gatewayKernels() {
  const res = await fetch(`${gw.base}/api/kernels`, { headers: { Authorization: `token ${gw.token}` } });
  assert.equal(res.status, 200);
  return (await res.json()).map(k => k.id);
}

function texts(result) {
  return result.content.filter(c => c.type === 'text').map(c => c.text).join('');
}

function stdioClient(args) {
  const stderr = [];
  const transport = new StdioClientTransport({ command: BIN, args, stderr: 'pipe' });
  transport.stderr.on('data', d => stderr.push(d.toString()));
  const client = new Client({ name: 'cellgate-test', version: '0.0.0' });
  return { client, transport, stderr };
}

function httpTransport(token = gw.token, extra = {}) {
  return new StreamableHTTPClientTransport(new URL(`${gw.base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${token}`, ...extra } },
  });
}

// A POST with headers fetch will not set (Host).
function rawPost(target, body, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: gw.port, path: target, method: 'POST',
      headers: { Authorization: `token ${gw.token}`, 'Content-Type': 'application/json',
                 Accept: 'application/json, text/event-stream', ...headers },
    }, res => {
      let data = '';
      res.on('data', d => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, body: data }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// The scenario every transport runs: each step a real tool call through the SDK's client.
async function scenario(client, label) {
  const session = `s-${label}`;
  const call = (name, args) => client.callTool({ name, arguments: { session, ...args } });

  // tools/list: JSON Schema inputs.
  const { tools } = await client.listTools();
  const names = tools.map(t => t.name).sort();
  assert.deepEqual(names, ['close_session', 'fork_session', 'list_files', 'list_sessions',
                           'read_file', 'restart_session', 'restore_snapshot', 'run_code',
                           'snapshot_session', 'write_file']);
  const run = tools.find(t => t.name === 'run_code');
  assert.equal(run.inputSchema.type, 'object');
  assert.deepEqual(run.inputSchema.required, ['code']);

  // State across calls (the SDK validates structuredContent against run_code's outputSchema).
  let r = await call('run_code', { code: 'x = 41\nprint("set")' });
  assert.equal(r.isError, false, texts(r));
  assert.equal(r.structuredContent.new_session, true);
  assert.equal(texts(r), 'set\n');
  const kernelId = r.structuredContent.kernel_id;
  r = await call('run_code', { code: 'x + 1' });
  assert.equal(r.isError, false, texts(r));
  assert.equal(r.structuredContent.result, '42');
  assert.equal(r.structuredContent.new_session, false);
  assert.equal(r.structuredContent.kernel_id, kernelId);
  assert.match(texts(r), /42/);

  // A matplotlib figure comes back as MCP image content.
  r = await call('run_code', {
    code: 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.title("t"); plt.show()\n' +
          'print("plotted")',
    timeout: 60,
  });
  assert.equal(r.isError, false, texts(r));
  const images = r.content.filter(c => c.type === 'image');
  assert.equal(images.length, 1, JSON.stringify(r.content.map(c => c.type)));
  assert.equal(images[0].mimeType, 'image/png');
  const png = Buffer.from(images[0].data, 'base64');
  assert.ok(png.subarray(0, 8).equals(PNG_MAGIC), 'not a PNG');
  assert.ok(png.length > 1000);
  assert.equal(r.structuredContent.artifacts.length, 1);
  assert.equal(r.structuredContent.artifacts[0].mime_type, 'image/png');
  assert.match(texts(r), /plotted/);
  // The figure's data too (the kernel's display formatters, through the agent API's `charts`).
  assert.equal(r.structuredContent.charts?.length, 1, 'no chart data');
  assert.equal(r.structuredContent.charts[0].type, 'line');
  assert.deepEqual(r.structuredContent.charts[0].elements[0].points, [[0, 1], [1, 3], [2, 2]]);
  assert.match(texts(r), /\[chart\] \{/);

  // A Python exception is a result with isError, not a JSON-RPC error.
  r = await call('run_code', { code: 'd = {}\nd["missing"]' });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.status, 'error');
  assert.equal(r.structuredContent.error.ename, 'KeyError');
  assert.equal(r.structuredContent.error.line, 2);
  assert.match(texts(r), /KeyError/);

  // Files: write, list, read, and the kernel sees them in its cwd.
  r = await call('write_file', { path: 'data/t.csv', content: 'x\n1\n2\n' });
  assert.equal(r.isError, false, texts(r));
  r = await call('list_files', { path: 'data' });
  assert.equal(r.isError, false, texts(r));
  assert.deepEqual(r.structuredContent.entries.map(e => e.name), ['t.csv']);
  r = await call('run_code', { code: 'import pandas as pd\nint(pd.read_csv("data/t.csv").x.sum())' });
  assert.equal(r.structuredContent.result, '3', texts(r));
  r = await call('run_code', { code: 'open("out.txt", "w").write("from the kernel")' });
  r = await call('read_file', { path: 'out.txt' });
  assert.equal(r.isError, false, texts(r));
  assert.equal(texts(r), 'from the kernel');
  r = await call('write_file', { path: 'bin.dat', content: Buffer.from([0, 255, 1]).toString('base64'), encoding: 'base64' });
  assert.equal(r.isError, false, texts(r));
  r = await call('read_file', { path: 'bin.dat' });
  assert.equal(r.content[0].type, 'resource');
  assert.deepEqual([...Buffer.from(r.content[0].resource.blob, 'base64')], [0, 255, 1]);
  r = await call('read_file', { path: '../etc/passwd' });
  assert.equal(r.isError, true);

  // Restart loses state; files stay.
  r = await call('restart_session', {});
  assert.equal(r.isError, false, texts(r));
  r = await call('run_code', { code: 'x' });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.error.ename, 'NameError');
  r = await call('read_file', { path: 'data/t.csv' });
  assert.equal(texts(r), 'x\n1\n2\n');

  // A bad argument is a tool error the model can correct; an unknown tool is a protocol error.
  r = await call('run_code', { code: 'pass', timeout: -1 });
  assert.equal(r.isError, true);
  await assert.rejects(client.callTool({ name: 'no_such_tool', arguments: {} }),
                       err => err.code === -32602);

  // list_sessions, then close.
  r = await client.callTool({ name: 'list_sessions', arguments: {} });
  assert.deepEqual(r.structuredContent.sessions.map(s => s.name), [session]);
  r = await call('close_session', {});
  assert.equal(r.isError, false, texts(r));
  assert.equal(r.structuredContent.closed, true);
  r = await client.callTool({ name: 'list_sessions', arguments: {} });
  assert.deepEqual(r.structuredContent.sessions, []);
  r = await call('list_files', {});
  assert.equal(r.isError, true);  // no such session any more
  return kernelId;
}

// ---- stdio ----------------------------------------------------------------------------------

describe('stdio', () => {
  test('embedded: cellgate mcp starts its own kernels', { timeout: 120_000 }, async () => {
    const { client, transport, stderr } = stdioClient(['mcp']);
    try {
      await client.connect(transport);
      assert.equal(client.getServerVersion().name, 'cellgate');
      assert.ok(client.getServerCapabilities().tools);
      await client.ping();
      await scenario(client, 'embedded');
      // A session left open is shut down when the client goes.
      const r = await client.callTool({ name: 'run_code', arguments: { code: '1' } });
      assert.equal(r.isError, false, texts(r));
    } catch (e) {
      e.message += `\n--- cellgate mcp stderr ---\n${stderr.join('').slice(-3000)}`;
      throw e;
    } finally {
      await client.close();
    }
  });

  test('--url: cellgate mcp in front of a running gateway', { timeout: 120_000 }, async () => {
    const { client, transport, stderr } = stdioClient(['mcp', '--url', gw.base, '--token', gw.token]);
    try {
      await client.connect(transport);
      const kernelId = await scenario(client, 'remote');
      assert.ok(!(await gatewayKernels()).includes(kernelId), 'close_session left the kernel');
      // Sessions still open when the client goes are deleted on the gateway.
      const r = await client.callTool({ name: 'run_code', arguments: { code: '1', session: 'left' } });
      const left = r.structuredContent.kernel_id;
      assert.ok((await gatewayKernels()).includes(left));
      await client.close();
      for (let i = 0; i < 50 && (await gatewayKernels()).includes(left); i++) {
        await new Promise(resolve => setTimeout(resolve, 100));
      }
      assert.ok(!(await gatewayKernels()).includes(left), 'the kernel outlived cellgate mcp');
    } catch (e) {
      e.message += `\n--- cellgate mcp stderr ---\n${stderr.join('').slice(-3000)}`;
      throw e;
    } finally {
      await client.close();
    }
  });

  test('--url with a bad token fails before serving', { timeout: 30_000 }, async () => {
    const proc = spawn(BIN, ['mcp', '--url', gw.base, '--token', 'wrong'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let err = '';
    proc.stderr.on('data', d => { err += d.toString(); });
    const code = await new Promise(resolve => proc.once('exit', c => resolve(c)));
    assert.equal(code, 2, err);
    assert.match(err, /403|401/);
  });
});

// ---- Streamable HTTP ------------------------------------------------------------------------

describe('streamable HTTP', () => {
  test('the SDK client against /mcp', { timeout: 120_000 }, async () => {
    const transport = httpTransport();
    const client = new Client({ name: 'cellgate-test', version: '0.0.0' });
    await client.connect(transport);
    assert.ok(transport.sessionId, 'no Mcp-Session-Id');
    assert.equal(transport.protocolVersion, LATEST_PROTOCOL_VERSION);
    const kernelId = await scenario(client, 'http');
    assert.ok(!(await gatewayKernels()).includes(kernelId));

    // Progress while a cell runs (the gateway's keepalive, every 3 s by default).
    const progress = [];
    const r = await client.callTool(
      { name: 'run_code', arguments: { code: 'import time; time.sleep(4); "done"', session: 'slow' } },
      undefined, { onprogress: p => progress.push(p), resetTimeoutOnProgress: true });
    assert.equal(r.structuredContent.result, "'done'");
    assert.ok(progress.length >= 1, 'no progress notification');
    const slow = r.structuredContent.kernel_id;
    assert.ok((await gatewayKernels()).includes(slow));

    // Ending the MCP session shuts its kernels down; the id is gone afterwards.
    const sid = transport.sessionId;
    await transport.terminateSession();
    assert.ok(!(await gatewayKernels()).includes(slow), 'DELETE /mcp left the kernel');
    const res = await fetch(`${gw.base}/mcp`, {
      method: 'POST',
      headers: { Authorization: `token ${gw.token}`, 'Content-Type': 'application/json',
                 Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': sid },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    });
    assert.equal(res.status, 404);
    await client.close();
  });

  test('a bad or missing token is 401', { timeout: 30_000 }, async () => {
    for (const token of ['wrong', '']) {
      const client = new Client({ name: 'cellgate-test', version: '0.0.0' });
      await assert.rejects(client.connect(httpTransport(token)), err => err.code === 401,
                           `token '${token}'`);
    }
    // ?token= works as on every other route.
    const transport = new StreamableHTTPClientTransport(new URL(`${gw.base}/mcp?token=${gw.token}`));
    const client = new Client({ name: 'cellgate-test', version: '0.0.0' });
    await client.connect(transport);
    await client.ping();
    await transport.terminateSession();
    await client.close();
  });

  test('transport rules: Origin, methods, versions, sessions', { timeout: 30_000 }, async () => {
    const post = (body, headers = {}) => fetch(`${gw.base}/mcp`, {
      method: 'POST',
      headers: { Authorization: `token ${gw.token}`, 'Content-Type': 'application/json',
                 Accept: 'application/json, text/event-stream', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
    const init = { jsonrpc: '2.0', id: 1, method: 'initialize',
                   params: { protocolVersion: '2025-06-18', capabilities: {},
                             clientInfo: { name: 'fetch', version: '0' } } };

    // DNS rebinding: a page from a name that resolves to 127.0.0.1 sends its own Origin AND
    // Host; the rest of the API counts that as same-origin, /mcp refuses it.
    const rebound = await rawPost('/mcp', JSON.stringify(init), {
      Origin: `http://evil.example:${gw.port}`, Host: `evil.example:${gw.port}`,
    });
    assert.equal(rebound.status, 403, rebound.body);
    assert.equal(JSON.parse(rebound.body).error.code, -32000);
    let res = await post(init, { Origin: `http://127.0.0.1:${gw.port}` });
    assert.equal(res.status, 200);

    // Version negotiation: the client's version when supported, else the latest.
    res = await post(init);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'application/json');
    const sid = res.headers.get('mcp-session-id');
    assert.match(sid, /^[0-9a-f]{32}$/);
    assert.equal((await res.json()).result.protocolVersion, '2025-06-18');
    res = await post({ ...init, params: { ...init.params, protocolVersion: '1999-01-01' } });
    assert.equal((await res.json()).result.protocolVersion, LATEST_PROTOCOL_VERSION);

    const s = { 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' };
    res = await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, s);
    assert.equal(res.status, 202);
    res = await post({ jsonrpc: '2.0', id: 2, method: 'ping' }, s);
    assert.deepEqual(await res.json(), { jsonrpc: '2.0', id: 2, result: {} });
    res = await post({ jsonrpc: '2.0', id: 3, method: 'no/such' }, s);
    assert.equal((await res.json()).error.code, -32601);
    // tools/call is streamed (SSE) to a client that accepts it; plain JSON otherwise.
    res = await post({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { arguments: {} } }, s);
    assert.equal(res.headers.get('content-type'), 'text/event-stream');
    const event = (await res.text()).split('\n').find(l => l.startsWith('data: '));
    assert.equal(JSON.parse(event.slice(6)).error.code, -32602);
    res = await post({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'list_sessions' } },
                     { ...s, Accept: 'application/json' });
    assert.deepEqual((await res.json()).result.structuredContent, { sessions: [] });
    res = await post('{not json', s);
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error.code, -32700);
    res = await post({ jsonrpc: '2.0', id: 5, method: 'ping' }, { ...s, 'MCP-Protocol-Version': '1999-01-01' });
    assert.equal(res.status, 400);
    res = await post({ jsonrpc: '2.0', id: 6, method: 'ping' });
    assert.equal(res.status, 400);  // no session id
    res = await post({ jsonrpc: '2.0', id: 7, method: 'ping' }, { 'Mcp-Session-Id': 'nope' });
    assert.equal(res.status, 404);
    res = await post({ jsonrpc: '2.0', id: 8, method: 'ping' }, { ...s, 'Content-Type': 'text/plain' });
    assert.equal(res.status, 415);

    res = await fetch(`${gw.base}/mcp`, { headers: { Authorization: `token ${gw.token}`, Accept: 'text/event-stream', ...s } });
    assert.equal(res.status, 405);
    res = await fetch(`${gw.base}/mcp`, { method: 'DELETE', headers: { Authorization: `token ${gw.token}`, ...s } });
    assert.equal(res.status, 204);
    res = await post({ jsonrpc: '2.0', id: 9, method: 'ping' }, s);
    assert.equal(res.status, 404);
  });
});
