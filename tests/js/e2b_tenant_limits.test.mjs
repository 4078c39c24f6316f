// A tenant's CPU budget and disk limit (--tenant-max-cpu-seconds, --tenant-max-disk-mb; docs/e2b.md
// "Tenants"), with E2B's SDK out of debug mode and the Jupyter and agent routes, each on a gateway
// of its own:
// - a tenant whose sandbox burns CPU past its budget is refused new sandboxes (RateLimitError) and
//   kernels (403), its kernel is throttled in its cgroup (the quota file, and the kernel's own
//   throttling count growing), another tenant is untouched, and the next window gives the kernel
//   its own limit back;
// - a tenant whose sandboxes' work dirs fill its disk limit is refused another sandbox and a
//   kernel until it kills one; another tenant is untouched;
// - a tenant's key on MCP (/mcp, @modelcontextprotocol/sdk): its conversation's kernels are its
//   own (listed on its Jupyter routes, not another's), another tenant's Mcp-Session-Id is 404, its
//   limits hold there too (--tenant-max-kernels), snapshots are the operator's.
//
// The window is short (WINDOW_SECONDS), so the test sees a window end; everything it waits for is
// an event it polls (a refusal, a file's content) with a deadline, never a guessed time.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { RateLimitError, Sandbox } from '@e2b/code-interpreter';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import * as helpers from './gateway_helpers.mjs';
import { servePort } from './serve_port.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');
const CELLGATE = path.join(BIN_DIR, 'cellgate');
const BUDGET_SECONDS = 3;
const WINDOW_SECONDS = 45;

for (const name of Object.keys(process.env)) {
  if (name.startsWith('E2B_')) {
    delete process.env[name];
  }
}

const WORK_DIR_MB = 512;  // serve's default --work-dir size: what each sandbox reserves
const DISK_MB = 2 * WORK_DIR_MB + 100;  // room for two sandboxes of a tenant, not three

// The gateway of the test running now.
let gw = null;
const logTail = (n = 60) => gw.log.join('').split('\n').slice(-n).join('\n');
const state = () => path.join(gw.dir, 'state');

const makeKey = tenant => helpers.makeKey(CELLGATE, state(), tenant);
const waitFor = (probe, what, ms = 120_000) => helpers.waitFor(probe, what, ms, logTail, 100);

async function call(key, method, route, body) {
  const res = await fetch(`http://127.0.0.1:${gw.port}${route}`, {
    method,
    headers: { Authorization: `token ${key}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json().catch(() => null) };
}

// The cgroup files of the kernels the state dir records: {id: {quota, stat}} (quota: v1
// cpu.cfs_quota_us or v2 cpu.max; stat: cpu.stat), read where the kernel's cgroup has them.
async function kernelCpu() {
  const out = {};
  for (const name of await readdir(path.join(state(), 'kernels'))) {
    if (!name.endsWith('.json')) {
      continue;
    }
    const record = JSON.parse(await readFile(path.join(state(), 'kernels', name), 'utf8'));
    const v1 = record.process.cgroup_version === 'v1';
    for (const dir of record.process.cgroup_paths) {
      const quota = await readFile(path.join(dir, v1 ? 'cpu.cfs_quota_us' : 'cpu.max'), 'utf8').catch(() => null);
      if (quota !== null) {
        const stat = await readFile(path.join(dir, 'cpu.stat'), 'utf8');
        out[record.id] = { quota: quota.trim(), throttled: Number(/nr_throttled (\d+)/.exec(stat)[1]), v1 };
      }
    }
  }
  return out;
}

// A gateway with `limits` (serve flags) and keys for alice and bob; the SDK pointed at it.
async function startGateway(limits) {
  gw = { proc: null, dir: null, port: 0, e2bPort: 0, token: '', log: [], keys: {} };
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-e2b-tenant-limits-'));
  gw.token = randomBytes(16).toString('hex');
  gw.keys.alice = await makeKey('alice');
  gw.keys.bob = await makeKey('bob');
  gw.e2bPort = await helpers.freePort();
  gw.proc = spawn(CELLGATE, ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
    '--state-dir', state(), '--e2b-port', String(gw.e2bPort), '--pool-size', '0', ...limits],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  gw.port = await servePort(gw, logTail);
  const url = `http://127.0.0.1:${gw.e2bPort}`;
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  process.env.E2B_DOMAIN = 'x.invalid';
}

async function stopGateway() {
  if (gw?.proc && gw.proc.exitCode === null && gw.proc.signalCode === null) {
    gw.proc.kill('SIGTERM');
    const timer = setTimeout(() => gw.proc.kill('SIGKILL'), 30_000);
    await gw.exited;
    clearTimeout(timer);
  }
  if (gw?.dir) {
    await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  }
}

after(stopGateway, { timeout: 40_000 });

test('a tenant past its CPU budget starts nothing and its kernel is throttled until the window ends',
  { timeout: 300_000 }, async () => {
    await startGateway(['--tenant-max-cpu-seconds', String(BUDGET_SECONDS),
      '--tenant-cpu-window', String(WINDOW_SECONDS)]);
    const sbx = await Sandbox.create({ apiKey: gw.keys.alice });
    try {
      const [kernelId] = Object.keys(await kernelCpu());
      assert.ok(kernelId, 'the sandbox kernel has a record with a CPU quota file');
      const own = (await kernelCpu())[kernelId].quota;
      // A cell that burns CPU until it is stopped; its answer is not waited for.
      sbx.runCode('while True:\n    pass', { timeoutMs: 280_000 }).catch(() => {});

      // Past the budget: E2B's create is 429, which the SDK raises as RateLimitError.
      const refused = await waitFor(async () => {
        try {
          const more = await Sandbox.create({ apiKey: gw.keys.alice });
          await more.kill();
          return false;
        } catch (e) {
          return e instanceof RateLimitError ? e : false;
        }
      }, 'alice refused a sandbox');
      assert.match(refused.message, /CPU-seconds/);
      // The Jupyter and agent routes refuse her too: a kernel and a one-shot cell.
      const kernel = await call(gw.keys.alice, 'POST', '/api/kernels', {});
      assert.equal(kernel.status, 403, JSON.stringify(kernel.body));
      assert.match(kernel.body.message, /--tenant-max-cpu-seconds/);
      const once = await call(gw.keys.alice, 'POST', '/api/execute', { code: '1' });
      assert.equal(once.status, 403, JSON.stringify(once.body));

      // Her kernel is held to 1% of a CPU, and the kernel itself says it is being held.
      const least = (await kernelCpu())[kernelId].v1 ? '1000' : '1000 100000';
      await waitFor(async () => (await kernelCpu())[kernelId].quota === least, 'the quota at its least');
      const before = (await kernelCpu())[kernelId].throttled;
      await waitFor(async () => (await kernelCpu())[kernelId].throttled > before + 3, 'throttled periods');

      // Another tenant is untouched.
      const bobs = await Sandbox.create({ apiKey: gw.keys.bob });
      const ran = await bobs.runCode('6 * 7');
      assert.equal(ran.text, '42');
      await bobs.kill();

      // The next window gives her kernel its own limit back (then it passes the budget again).
      await waitFor(async () => (await kernelCpu())[kernelId].quota === own, 'its own quota back',
        (WINDOW_SECONDS + 60) * 1000);
      const log = logTail(400);
      assert.match(log, /throttled until the window ends/);
    } finally {
      await sbx.kill();
      await stopGateway();
    }
  });

test('a tenant whose sandboxes fill its disk limit starts nothing more until it kills one',
  { timeout: 180_000 }, async () => {
    await startGateway(['--tenant-max-disk-mb', String(DISK_MB)]);
    const made = [];
    try {
      made.push(await Sandbox.create({ apiKey: gw.keys.alice }));
      made.push(await Sandbox.create({ apiKey: gw.keys.alice }));
      const refused = await Sandbox.create({ apiKey: gw.keys.alice }).then(
        s => { made.push(s); return null; }, e => e);
      assert.ok(refused instanceof RateLimitError, String(refused));
      assert.match(refused.message, /--tenant-max-disk-mb/);
      const kernel = await call(gw.keys.alice, 'POST', '/api/kernels', {});
      assert.equal(kernel.status, 403, JSON.stringify(kernel.body));
      assert.match(kernel.body.message, /--tenant-max-disk-mb/);
      // Another tenant has room of its own; the operator has no limit.
      const bobs = await Sandbox.create({ apiKey: gw.keys.bob });
      await bobs.kill();
      const operators = await call(gw.token, 'POST', '/api/kernels', {});
      assert.equal(operators.status, 201, JSON.stringify(operators.body));
      assert.equal((await call(gw.token, 'DELETE', `/api/kernels/${operators.body.id}`)).status, 204);
      // A sandbox killed frees its room.
      await made.pop().kill();
      made.push(await Sandbox.create({ apiKey: gw.keys.alice }));
    } finally {
      for (const s of made) {
        await s.kill();
      }
      await stopGateway();
    }
  });

test('a tenant\'s key on MCP: its own conversations and kernels, its limits', { timeout: 180_000 }, async () => {
  await startGateway(['--tenant-max-kernels', '1']);
  const connect = async key => {
    const client = new Client({ name: 'tenant-test', version: '1.0.0' });
    const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${gw.port}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${key}` } },
    });
    await client.connect(transport);
    return { client, transport };
  };
  const text = r => r.content.map(c => c.text ?? '').join('');
  const alice = await connect(gw.keys.alice);
  const bob = await connect(gw.keys.bob);
  try {
    const ran = await alice.client.callTool({ name: 'run_code', arguments: { code: 'print(6 * 7)' } });
    assert.ok(!ran.isError, text(ran));
    assert.match(text(ran), /42/);
    // Her MCP kernel is hers on the Jupyter routes, and not bob's.
    const mine = await call(gw.keys.alice, 'GET', '/api/kernels');
    assert.equal(mine.status, 200);
    assert.equal(mine.body.length, 1, JSON.stringify(mine.body));
    assert.deepEqual((await call(gw.keys.bob, 'GET', '/api/kernels')).body, []);
    assert.equal((await call(gw.keys.bob, 'GET', `/api/kernels/${mine.body[0].id}`)).status, 404);
    // Bob cannot use her conversation: its id is unknown to his key (and to the operator's).
    for (const key of [gw.keys.bob, gw.token]) {
      const res = await fetch(`http://127.0.0.1:${gw.port}/mcp`, {
        method: 'POST',
        headers: {
          Authorization: `Bearer ${key}`, 'Content-Type': 'application/json',
          Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': alice.transport.sessionId,
        },
        body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }),
      });
      assert.equal(res.status, 404);
    }
    // --tenant-max-kernels 1: a second session is refused as a tool error naming the limit.
    const second = await alice.client.callTool({ name: 'run_code', arguments: { code: '1', session: 'two' } });
    assert.ok(second.isError);
    assert.match(text(second), /--tenant-max-kernels/);
    const snap = await alice.client.callTool({ name: 'snapshot_session', arguments: {} });
    assert.ok(snap.isError);
    assert.match(text(snap), /operator/);
    // Bob's own conversation works, within his own limit.
    const his = await bob.client.callTool({ name: 'run_code', arguments: { code: 'print(7 * 6)' } });
    assert.ok(!his.isError, text(his));
    // /metrics stays the operator's.
    assert.equal((await call(gw.keys.alice, 'GET', '/metrics')).status, 403);
  } finally {
    await alice.transport.terminateSession().catch(() => {});
    await bob.transport.terminateSession().catch(() => {});
    await alice.client.close();
    await bob.client.close();
    await stopGateway();
  }
});
