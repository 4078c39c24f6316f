// E2B's SDK, unmodified and out of debug mode, against cellgate's E2B control plane
// (docs/e2b.md, "The control plane"): @e2b/code-interpreter 2.x and the `e2b` core package it
// re-exports, with E2B_API_URL and E2B_SANDBOX_URL both at the gateway's E2B port and API keys
// made by `cellgate keys create`.
//
// Flags this file assumes of `cellgate serve`:
//   --ip 127.0.0.1 --port 0 --token <t> --state-dir <d> --e2b-port <free port>
//   --no-zygote --checkpoint-without-landlock --pool-size 0   (pause, snapshots and fork: CRIU)
//   --tenant-max-sandboxes 2 --tenant-max-kernels 1
//   --e2b-webhook http://127.0.0.1:<receiver>/hook --e2b-webhook-secret-file <file>
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { AuthenticationError, RateLimitError, Sandbox, SandboxNotFoundError } from '@e2b/code-interpreter';

import * as helpers from './gateway_helpers.mjs';
import { servePort } from './serve_port.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');
const CELLGATE = path.join(BIN_DIR, 'cellgate');
const MAX_PER_TENANT = 2;
// Pause, snapshots and fork need CRIU (scripts/install-criu, as in CI) and root: skipped without.
const CRIU = process.env.CELLGATE_CRIU || '/opt/cellgate/criu/sbin/criu';
const NO_CHECKPOINTS = process.getuid() !== 0 || !existsSync(CRIU)
  ? `no CRIU at ${CRIU} (or not root): pause, snapshots and fork cannot work here` : false;

for (const name of Object.keys(process.env)) {
  if (name.startsWith('E2B_')) {
    delete process.env[name];  // no debug mode, no other server
  }
}

const gw = { proc: null, dir: null, port: 0, e2bPort: 0, token: '', log: [], keys: {} };
// The webhook receiver: every event as {body, signature}.
const hooks = { server: null, secret: randomBytes(24).toString('hex'), events: [] };
const logTail = (n = 60) => gw.log.join('').split('\n').slice(-n).join('\n');

// The gateway's exit ({code, signal}), or null if it has not exited within `ms`.
function exitWithin(ms) {
  let timer;
  return Promise.race([gw.exited, new Promise(resolve => { timer = setTimeout(() => resolve(null), ms); })])
    .finally(() => clearTimeout(timer));
}

const makeKey = tenant => helpers.makeKey(CELLGATE, path.join(gw.dir, 'state'), tenant);
const waitFor = (probe, what, ms = 60_000) => helpers.waitFor(probe, what, ms, logTail);

async function startGateway() {
  gw.log = [];
  gw.proc = spawn(CELLGATE, gw.args, { stdio: ['ignore', 'pipe', 'pipe'] });
  gw.port = await servePort(gw, logTail);
}

// Options every SDK call of `tenant` gets (the environment holds alice's key).
const as = tenant => ({ apiKey: gw.keys[tenant] });

before(async () => {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-e2b-sandboxes-'));
  gw.token = randomBytes(16).toString('hex');
  gw.keys.alice = await makeKey('alice');
  gw.keys.bob = await makeKey('bob');
  gw.e2bPort = await helpers.freePort();
  hooks.server = http.createServer((req, res) => {
    let body = '';
    req.on('data', d => { body += d; });
    req.on('end', () => {
      hooks.events.push({ body, signature: req.headers['x-cellgate-signature'], headers: req.headers });
      res.writeHead(204).end();
    });
  });
  await new Promise(resolve => hooks.server.listen(0, '127.0.0.1', resolve));
  const secretFile = path.join(gw.dir, 'webhook-secret');
  await writeFile(secretFile, hooks.secret + '\n', { mode: 0o600 });
  gw.args = ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
    '--state-dir', path.join(gw.dir, 'state'), '--e2b-port', String(gw.e2bPort),
    '--no-zygote', '--checkpoint-without-landlock', '--pool-size', '0',
    '--tenant-max-sandboxes', String(MAX_PER_TENANT), '--tenant-max-kernels', '1',
    '--e2b-webhook', `http://127.0.0.1:${hooks.server.address().port}/hook`,
    '--e2b-webhook-secret-file', secretFile];
  await startGateway();
  const url = `http://127.0.0.1:${gw.e2bPort}`;
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  process.env.E2B_DOMAIN = 'x.invalid';
  process.env.E2B_API_KEY = gw.keys.alice;
}, { timeout: 60_000 });

after(async () => {
  if (gw.proc && gw.proc.exitCode === null && gw.proc.signalCode === null) {
    gw.proc.kill('SIGTERM');
    await exitWithin(30_000);
    if (gw.proc.exitCode === null && gw.proc.signalCode === null) {
      gw.proc.kill('SIGKILL');
    }
  }
  await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  hooks.server?.close();
}, { timeout: 40_000 });

// The lifecycle events of one sandbox, each signed with the shared secret, once they arrived.
async function eventsOf(sandboxId, labels) {
  return waitFor(() => {
    const mine = hooks.events.map(e => ({ ...e, json: JSON.parse(e.body) }))
      .filter(e => e.json.sandboxId === sandboxId);
    for (const e of mine) {
      const want = 'sha256=' + createHmac('sha256', hooks.secret).update(e.body).digest('hex');
      assert.equal(e.signature, want, `the signature of ${e.body}`);
      // E2B's own headers, as a receiver written for E2B's webhooks checks them: the unpadded
      // base64 of SHA-256 over the secret followed by the body.
      const e2b = createHash('sha256').update(hooks.secret + e.body).digest('base64').replace(/=+$/, '');
      assert.equal(e.headers['e2b-signature'], e2b, `the e2b-signature of ${e.body}`);
      assert.equal(e.headers['e2b-signature-version'], 'v1');
      assert.ok(e.headers['e2b-webhook-id'] && e.headers['e2b-delivery-id'], JSON.stringify(e.headers));
    }
    const seen = mine.map(e => e.json.eventLabel);
    return labels.every(l => seen.includes(l)) && mine;
  }, `webhooks ${labels} of ${sandboxId}`, 10_000);
}

// GET on E2B's events API with `key`, its JSON answer (200 expected).
async function lifecycleEvents(key, route) {
  const res = await fetch(`${process.env.E2B_API_URL}${route}`, { headers: { 'X-API-Key': key } });
  assert.equal(res.status, 200, await res.clone().text());
  return res.json();
}

async function listAll(opts) {
  const paginator = Sandbox.list(opts);
  const all = [];
  while (paginator.hasNext) {
    all.push(...await paginator.nextItems());
  }
  return all;
}

test('create, getInfo, list by metadata, kill twice, isRunning', { timeout: 120_000 }, async () => {
  const tag = randomBytes(4).toString('hex');
  const sbx = await Sandbox.create({ metadata: { suite: tag }, timeoutMs: 120_000 });
  assert.match(sbx.sandboxId, /^[0-9a-f]{20}$/);
  const info = await sbx.getInfo();
  assert.equal(info.sandboxId, sbx.sandboxId);
  assert.equal(info.state, 'running');
  assert.deepEqual(info.metadata, { suite: tag });
  const lifetime = info.endAt.getTime() - info.startedAt.getTime();
  assert.ok(Math.abs(lifetime - 120_000) < 2_000, `endAt - startedAt = ${lifetime} ms`);
  assert.equal(await sbx.isRunning(), true);

  const execution = await sbx.runCode('import os\nprint(os.getcwd())\n6 * 7');
  assert.equal(execution.text, '42', JSON.stringify(execution));
  assert.equal(execution.logs.stdout.join(''), '/home/user\n');

  const listed = await listAll({ query: { metadata: { suite: tag } } });
  assert.deepEqual(listed.map(s => s.sandboxId), [sbx.sandboxId]);
  assert.equal(listed[0].state, 'running');

  assert.equal(await sbx.kill(), true);
  assert.equal(await Sandbox.kill(sbx.sandboxId), false);
  assert.equal(await sbx.isRunning(), false);
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError);
  assert.deepEqual(await listAll({ query: { metadata: { suite: tag } } }), []);

  const events = await eventsOf(sbx.sandboxId, ['created', 'killed']);
  const created = events.find(e => e.json.eventLabel === 'created').json;
  assert.equal(created.type, 'sandbox.lifecycle.created');
  assert.equal(created.sandboxTeamId, 'alice');
  assert.deepEqual(created.sandboxMetadata, { suite: tag });

  // E2B's events API: the same events (the same ids as the webhooks'), newest first, to alice only.
  const api = await lifecycleEvents(gw.keys.alice, `/events/sandboxes/${sbx.sandboxId}`);
  assert.deepEqual(api.map(e => e.eventLabel), ['killed', 'created']);
  assert.equal(api[1].id, created.id);
  assert.equal(api[0].version, 'v1');
  assert.deepEqual(await lifecycleEvents(gw.keys.bob, `/events/sandboxes/${sbx.sandboxId}`), []);
  const oldestFirst = await lifecycleEvents(gw.keys.alice,
    `/events/sandboxes/${sbx.sandboxId}?orderAsc=true&limit=1`);
  assert.deepEqual(oldestFirst.map(e => e.eventLabel), ['created']);
  const killedOnly = await lifecycleEvents(gw.keys.alice,
    `/events/sandboxes/${sbx.sandboxId}?types=sandbox.lifecycle.killed`);
  assert.deepEqual(killedOnly.map(e => e.eventLabel), ['killed']);
  const teams = await lifecycleEvents(gw.keys.alice, '/events/sandboxes?limit=100');
  assert.ok(teams.some(e => e.sandboxId === sbx.sandboxId));
  assert.ok(teams.every(e => e.sandboxTeamId === 'alice'), JSON.stringify(teams));
  const bad = await fetch(`${process.env.E2B_API_URL}/events/sandboxes?limit=0`,
    { headers: { 'X-API-Key': gw.keys.alice } });
  assert.equal(bad.status, 400);
});

test('list: limit 1 gives two pages, newest first', { timeout: 120_000 }, async () => {
  const tag = randomBytes(4).toString('hex');
  const first = await Sandbox.create({ metadata: { page: tag } });
  const second = await Sandbox.create({ metadata: { page: tag } });
  try {
    const paginator = Sandbox.list({ query: { metadata: { page: tag } }, limit: 1 });
    const one = await paginator.nextItems();
    assert.deepEqual(one.map(s => s.sandboxId), [second.sandboxId]);
    assert.equal(paginator.hasNext, true);
    const two = await paginator.nextItems();
    assert.deepEqual(two.map(s => s.sandboxId), [first.sandboxId]);
    assert.equal(paginator.hasNext, false);
  } finally {
    await first.kill();
    await second.kill();
  }
});

test('setTimeout: the sandbox is killed when it expires', { timeout: 60_000 }, async () => {
  const sbx = await Sandbox.create();
  await sbx.setTimeout(1_000);
  await waitFor(async () => {
    try {
      await Sandbox.getInfo(sbx.sandboxId);
      return false;
    } catch (e) {
      return e instanceof SandboxNotFoundError;
    }
  }, 'the expired sandbox gone');
  assert.equal(await sbx.isRunning(), false);
});

test('pause keeps the kernel\'s variables; connect resumes; state filter', { timeout: 180_000, skip: NO_CHECKPOINTS }, async () => {
  const tag = randomBytes(4).toString('hex');
  const sbx = await Sandbox.create({ metadata: { pause: tag } });
  const other = await Sandbox.create({ metadata: { pause: tag } });
  try {
    await sbx.runCode('x = 41');
    // A command running at the pause: envd's commands are entered into the jail from outside
    // the kernel's process tree, so CRIU does not take them (docs/e2b.md, "Pause"). Its stream
    // is cut, as E2B's are; what it wrote to the sandbox's files stays.
    const bg = await sbx.commands.run('echo started > marker.txt; exec sleep 600', { background: true });
    await waitFor(() => sbx.files.exists('marker.txt'), 'the background command started');
    const bgEnded = bg.wait().then(r => ({ resolved: r }), e => ({ rejected: e }));
    assert.equal(await sbx.pause(), true, logTail());
    assert.ok('rejected' in await bgEnded, 'the command\'s stream is cut at the pause');
    assert.equal(await sbx.pause(), false);  // paused already: E2B's 409
    assert.equal((await sbx.getInfo()).state, 'paused');
    assert.equal(await sbx.isRunning(), false);
    const paused = await listAll({ query: { metadata: { pause: tag }, state: ['paused'] } });
    assert.deepEqual(paused.map(s => s.sandboxId), [sbx.sandboxId]);
    const running = await listAll({ query: { metadata: { pause: tag }, state: ['running'] } });
    assert.deepEqual(running.map(s => s.sandboxId), [other.sandboxId]);

    const before = (await sbx.getInfo()).endAt.getTime();
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 });
    const info = await again.getInfo();
    assert.equal(info.state, 'running');
    assert.ok(info.endAt.getTime() >= before, 'connect never shortens the end time');
    assert.equal(await again.isRunning(), true);
    const execution = await again.runCode('x + 1');
    assert.equal(execution.text, '42', JSON.stringify(execution));
    assert.deepEqual(await again.commands.list(), [], 'no command survives a pause here');
    assert.equal(await again.files.read('marker.txt'), 'started\n');
    await eventsOf(sbx.sandboxId, ['created', 'paused', 'resumed']);
  } finally {
    await sbx.kill();
    await other.kill();
  }
});

test('onTimeout pause: expiry pauses, connect resumes', { timeout: 120_000, skip: NO_CHECKPOINTS }, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } });
  try {
    await sbx.runCode('y = "kept"');
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', 'auto-paused');
    const info = await sbx.getInfo();
    assert.equal(info.lifecycle.onTimeout, 'pause');
    await sbx.connect({ timeoutMs: 60_000 });
    assert.equal((await sbx.runCode('y')).text, 'kept');
  } finally {
    await sbx.kill();
  }
});

test('snapshots: create, start from one, list, delete; fork', { timeout: 240_000, skip: NO_CHECKPOINTS }, async () => {
  // The operator's key: four sandboxes at once, past a tenant's limit.
  const sbx = await Sandbox.create({ apiKey: `e2b_${gw.token}` });
  const made = [];
  try {
    await sbx.runCode('z = 7');
    const snap = await sbx.createSnapshot({ name: 'seven' });
    assert.match(snap.snapshotId, /^[0-9a-f]{32}$/);
    assert.deepEqual(snap.names, ['seven']);
    const listed = await sbx.listSnapshots().nextItems();  // the sandbox's own key
    await eventsOf(sbx.sandboxId, ['snapshotted']);
    assert.deepEqual(listed.map(s => s.snapshotId), [snap.snapshotId]);

    const copy = await Sandbox.create(snap.snapshotId, { apiKey: `e2b_${gw.token}` });
    made.push(copy);
    assert.equal((await copy.runCode('z * 6')).text, '42');
    assert.equal((await copy.getInfo()).templateId, snap.snapshotId);

    const forks = await sbx.fork({ count: 2 });
    assert.equal(forks.length, 2);
    for (const fork of forks) {
      assert.ok(!(fork instanceof Error), String(fork));
      made.push(fork);
      assert.notEqual(fork.sandboxId, sbx.sandboxId);
      assert.equal((await fork.runCode('z')).text, '7');
    }
    await forks[0].runCode('z = 0');
    assert.equal((await sbx.runCode('z')).text, '7', 'a fork is a copy');

    // Another tenant cannot see it, nor delete it.
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, as('alice')), false);
    assert.deepEqual(await Sandbox.listSnapshots(as('alice')).nextItems(), []);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: `e2b_${gw.token}` }), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: `e2b_${gw.token}` }), false);
  } finally {
    for (const s of made) {
      await s.kill();
    }
    await sbx.kill();
  }
});

test('getMetrics: sampled from the sandbox\'s cgroup', { timeout: 60_000 }, async () => {
  const sbx = await Sandbox.create();
  try {
    const metrics = await sbx.getMetrics();
    assert.ok(metrics.length >= 1, JSON.stringify(metrics));
    const m = metrics.at(-1);
    assert.ok(m.memTotal > 0 && m.memUsed > 0, JSON.stringify(m));
    assert.ok(m.cpuCount >= 1 && m.diskTotal > 0, JSON.stringify(m));
    assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()));
  } finally {
    await sbx.kill();
  }
});

test('commands and files run in the sandbox through envd; another sandbox\'s token is refused',
  { timeout: 120_000 }, async () => {
    const mine = await Sandbox.create(as('alice'));
    const theirs = await Sandbox.create(as('bob'));
    try {
      const r = await mine.commands.run('echo hi; pwd');
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, 'hi\n/home/user\n');
      await mine.files.write('/home/user/note.txt', 'from alice');
      assert.equal(await mine.files.read('/home/user/note.txt'), 'from alice');
      // Each sandbox is a jail of its own: bob's has no such file.
      assert.equal(await theirs.files.exists('/home/user/note.txt'), false);
      // Alice's sandbox id with bob's envd access token: envd refuses it.
      const forged = new Sandbox({
        sandboxId: mine.sandboxId,
        envdVersion: '0.6.4',
        envdAccessToken: theirs.envdAccessToken,
        sandboxUrl: `http://127.0.0.1:${gw.e2bPort}`,
        debug: false,
      });
      await assert.rejects(forged.commands.run('echo no'), AuthenticationError);
      await assert.rejects(forged.files.read('/home/user/note.txt'), AuthenticationError);
    } finally {
      await mine.kill();
      await theirs.kill();
    }
  });

test('signed file URLs (secure sandboxes): plain fetch, no headers; expiry, tampering and another sandbox\'s signature are 401',
  { timeout: 120_000 }, async () => {
    const mine = await Sandbox.create(as('alice'));
    const theirs = await Sandbox.create(as('bob'));
    try {
      assert.ok(mine.envdAccessToken, 'Sandbox.create is secure by default');
      const file = '/home/user/signed.txt';
      const form = text => {
        const f = new FormData();
        f.append('file', new Blob([text]), file);
        return f;
      };
      // One URL for every sandbox (E2B_SANDBOX_URL): the signature alone finds the sandbox.
      const up = await mine.uploadUrl(file);
      assert.match(up, /signature=v1_/);
      const put = await fetch(up, { method: 'POST', body: form('signed upload') });
      assert.equal(put.status, 200, await put.clone().text());
      assert.equal((await put.json())[0].path, file);
      const down = await mine.downloadUrl(file);
      const got = await fetch(down);
      assert.equal(got.status, 200);
      assert.equal(await got.text(), 'signed upload');
      assert.equal(await mine.files.read(file), 'signed upload');
      // With an expiration in the future, and one that has passed.
      const timed = await mine.downloadUrl(file, { useSignatureExpiration: 120 });
      assert.match(timed, /signature_expiration=\d+/);
      assert.equal(await (await fetch(timed)).text(), 'signed upload');
      const timedUp = await mine.uploadUrl(file, { useSignatureExpiration: 120 });
      assert.equal((await fetch(timedUp, { method: 'POST', body: form('again') })).status, 200);
      const expired = await fetch(await mine.downloadUrl(file, { useSignatureExpiration: -10 }));
      assert.equal(expired.status, 401);
      assert.deepEqual(await expired.json(), { code: 401, message: 'signature is already expired' });
      // Tampered: another path under the same signature, a changed signature, a read as a write.
      const url = new URL(down);
      url.searchParams.set('path', '/home/user/other.txt');
      assert.equal((await fetch(url)).status, 401);
      const sig = new URL(down);
      const s = sig.searchParams.get('signature');
      sig.searchParams.set('signature', s.slice(0, -1) + (s.endsWith('A') ? 'B' : 'A'));
      assert.equal((await fetch(sig)).status, 401);
      assert.equal((await fetch(down, { method: 'POST', body: form('forged') })).status, 401);
      // Bob's signature for the same path: with Alice's sandbox named, refused; without, it
      // reaches Bob's sandbox (no such file there), never Alice's file.
      const bobs = await theirs.downloadUrl(file);
      const named = await fetch(bobs, { headers: { 'E2b-Sandbox-Id': mine.sandboxId } });
      assert.equal(named.status, 401);
      const unnamed = await fetch(bobs);
      assert.equal(unnamed.status, 404, await unnamed.text());
      assert.equal(await mine.files.read(file), 'again');
    } finally {
      await mine.kill();
      await theirs.kill();
    }
  });

test('tenants: another tenant\'s sandbox is 404, lists are filtered; a bad key is 401',
  { timeout: 120_000 }, async () => {
    const mine = await Sandbox.create(as('alice'));
    const theirs = await Sandbox.create(as('bob'));
    try {
      await assert.rejects(Sandbox.getInfo(theirs.sandboxId, as('alice')), SandboxNotFoundError);
      await assert.rejects(Sandbox.getInfo(mine.sandboxId, as('bob')), SandboxNotFoundError);
      assert.equal(await Sandbox.kill(mine.sandboxId, as('bob')), false);
      await assert.rejects(Sandbox.connect(mine.sandboxId, as('bob')), SandboxNotFoundError);
      const bobs = (await listAll(as('bob'))).map(s => s.sandboxId);
      assert.deepEqual(bobs, [theirs.sandboxId]);
      const alices = (await listAll(as('alice'))).map(s => s.sandboxId);
      assert.ok(alices.includes(mine.sandboxId) && !alices.includes(theirs.sandboxId));
      // The operator's token sees both.
      const all = (await listAll({ apiKey: `e2b_${gw.token}` })).map(s => s.sandboxId);
      assert.ok(all.includes(mine.sandboxId) && all.includes(theirs.sandboxId));
      // A key nobody made.
      await assert.rejects(listAll({ apiKey: `e2b_${'0'.repeat(40)}` }), AuthenticationError);
      // A revoked key stops working without a restart.
      const carol = await makeKey('carol');
      assert.deepEqual(await listAll({ apiKey: carol }), []);
      await promisify(execFile)(CELLGATE, ['keys', 'revoke', carol, '--state-dir', path.join(gw.dir, 'state')]);
      await waitFor(async () => {
        try {
          await listAll({ apiKey: carol });
          return false;
        } catch (e) {
          return e instanceof AuthenticationError;
        }
      }, 'the revoked key refused', 10_000);
    } finally {
      await mine.kill();
      await theirs.kill();
    }
  });

test('a tenant over its limit gets 429 (RateLimitError)', { timeout: 180_000 }, async () => {
  const made = [];
  try {
    for (let i = 0; i < MAX_PER_TENANT; ++i) {
      made.push(await Sandbox.create(as('bob')));
    }
    await assert.rejects(Sandbox.create(as('bob')), RateLimitError);
    await made.pop().kill();
    made.push(await Sandbox.create(as('bob')));
  } finally {
    for (const s of made) {
      await s.kill();
    }
  }
});

test('a tenant\'s key on the Jupyter and agent routes reaches its own kernels only',
  { timeout: 120_000 }, async () => {
    const api = `http://127.0.0.1:${gw.port}`;
    const call = (key, method, route, body) => fetch(`${api}${route}`, {
      method,
      headers: { Authorization: `token ${key}`, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(60_000),
    });
    const started = await call(gw.keys.alice, 'POST', '/api/kernels', {});
    assert.equal(started.status, 201, await started.clone().text());
    const { id } = await started.json();
    try {
      const ids = async key => (await (await call(key, 'GET', '/api/kernels')).json()).map(k => k.id);
      assert.deepEqual(await ids(gw.keys.alice), [id]);
      assert.ok(!(await ids(gw.keys.bob)).includes(id));
      assert.ok((await ids(gw.token)).includes(id), 'the operator sees every kernel');
      assert.equal((await call(gw.keys.bob, 'GET', `/api/kernels/${id}`)).status, 404);
      assert.equal((await call(gw.keys.bob, 'POST', `/api/kernels/${id}/execute`, { code: '1' })).status, 404);
      const ran = await call(gw.keys.alice, 'POST', `/api/kernels/${id}/execute`, { code: 'print(6 * 7)' });
      assert.equal(ran.status, 200);
      assert.equal((await ran.json()).stdout, '42\n');
      // A session naming another's kernel, the operator's routes, a key nobody made.
      assert.equal((await call(gw.keys.bob, 'POST', '/api/sessions',
        { path: 'x.ipynb', type: 'notebook', kernel: { id } })).status, 404);
      assert.equal((await call(gw.keys.bob, 'GET', '/api/snapshots')).status, 403);
      assert.equal((await call(gw.keys.bob, 'GET', '/metrics')).status, 403);
      assert.equal((await call(`e2b_${'1'.repeat(40)}`, 'GET', '/api/kernels')).status, 403);
      assert.equal((await call(gw.keys.bob, 'DELETE', `/api/kernels/${id}`)).status, 404);
      // --tenant-max-kernels 1: alice's second kernel is refused as Jupyter refuses a limit.
      const second = await call(gw.keys.alice, 'POST', '/api/kernels', {});
      assert.equal(second.status, 403, await second.text());
    } finally {
      assert.equal((await call(gw.keys.alice, 'DELETE', `/api/kernels/${id}`)).status, 204);
    }
  });

test('a sandbox outlives a gateway restart that keeps its kernel (SIGUSR2)', { timeout: 120_000 }, async () => {
  const sbx = await Sandbox.create({ metadata: { kept: 'yes' }, timeoutMs: 600_000 });
  try {
    await sbx.runCode('w = 5');
    const before = await sbx.getInfo();
    gw.proc.kill('SIGUSR2');  // hand the kernels over to the next gateway on the state dir
    const done = await exitWithin(30_000);
    assert.ok(done && done.code === 0, `exit after SIGUSR2: ${JSON.stringify(done)}\n${logTail()}`);
    await startGateway();
    const after = await sbx.getInfo();
    assert.equal(after.state, 'running');
    assert.deepEqual(after.metadata, { kept: 'yes' });
    assert.equal(after.endAt.getTime(), before.endAt.getTime());
    assert.equal((await sbx.runCode('w * 2')).text, '10', logTail());
    assert.equal(await sbx.isRunning(), true);
    // The events the gateway before this one recorded are still there.
    const kept = await lifecycleEvents(gw.keys.alice, `/events/sandboxes/${sbx.sandboxId}`);
    assert.deepEqual(kept.map(e => e.eventLabel), ['created']);
  } finally {
    await sbx.kill();
  }
});
