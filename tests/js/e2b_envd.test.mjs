// E2B's core SDK (e2b 2.x), unmodified and out of debug mode, driving cellgate's envd (gateway/envd)
// with E2B_SANDBOX_URL at the E2B port: commands, background processes, stdin, a PTY, a flood
// of output, and a stream cut when the sandbox (here: a kernel) is deleted; the filesystem
// (WatchDir among it) and /files with gzip. Until the control
// plane exists, a sandbox id is a running kernel's id and its envd access token the gateway's
// token; the `Sandbox` object is made the way Sandbox.create() makes it from the API's answer.
//
// Flags this file assumes of `cellgate serve`:
//   --ip 127.0.0.1 --port 0 --token <t> --state-dir <d> --e2b-port <free port>
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import http from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createGzip, gunzipSync } from 'node:zlib';

import { CommandExitError, FileNotFoundError, InvalidArgumentError, Sandbox } from 'e2b';

import { servePort } from './serve_port.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');

for (const name of Object.keys(process.env)) {
  if (name.startsWith('E2B_')) {
    delete process.env[name];
  }
}
process.env.E2B_DOMAIN = 'x.invalid';

const gw = { proc: null, dir: null, port: 0, e2bPort: 0, token: '', log: [] };
const logTail = (n = 40) => gw.log.join('').split('\n').slice(-n).join('\n');

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function api(method, route, body) {
  const res = await fetch(`http://127.0.0.1:${gw.port}${route}`, {
    method,
    headers: { Authorization: `token ${gw.token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : null };
}

async function newSandbox() {
  const created = await api('POST', '/api/kernels', { name: 'python3' });
  assert.equal(created.status, 201, JSON.stringify(created.json));
  const sandbox = new Sandbox({
    sandboxId: created.json.id,
    envdVersion: '0.6.4',
    envdAccessToken: gw.token,
    sandboxUrl: `http://127.0.0.1:${gw.e2bPort}`,
    debug: false,
  });
  return sandbox;
}

async function gatewayRssKiB() {
  const status = await readFile(`/proc/${gw.proc.pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)[1]);
}

let sbx;

before(async () => {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-envd-'));
  gw.token = randomBytes(16).toString('hex');
  gw.e2bPort = await freePort();
  process.env.E2B_SANDBOX_URL = `http://127.0.0.1:${gw.e2bPort}`;
  gw.proc = spawn(
    path.join(BIN_DIR, 'cellgate'),
    ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
     '--state-dir', path.join(gw.dir, 'state'), '--e2b-port', String(gw.e2bPort)],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  gw.port = await servePort(gw, logTail);
  sbx = await newSandbox();
}, { timeout: 90_000 });

after(async () => {
  if (gw.proc && gw.proc.exitCode === null) {
    // A command still running (and a client watching it) must not hold the gateway's exit up.
    const left = sbx ? await sbx.commands.run('sleep 300', { background: true }).catch(() => null) : null;
    gw.proc.kill('SIGTERM');
    const done = await Promise.race([gw.exited, new Promise(resolve => setTimeout(() => resolve(null), 30_000))]);
    if (left) {
      await left.wait().catch(() => {});
    }
    assert.ok(done, `cellgate serve did not exit within 30 s of SIGTERM\n${logTail()}`);
    assert.equal(done.code, 0, logTail());
  }
  if (gw.dir) {
    await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  }
}, { timeout: 60_000 });

test('commands.run: stdout, stderr, exit code, a login bash in /home/user', { timeout: 60_000 }, async () => {
  assert.equal(await sbx.isRunning(), true);
  const r = await sbx.commands.run('echo hello; echo oops >&2; pwd; echo "$HOME $USER"; id -u');
  assert.equal(r.exitCode, 0);
  const lines = r.stdout.split('\n');
  assert.equal(lines[0], 'hello');
  assert.equal(lines[1], '/home/user');
  assert.equal(lines[2], '/home/user user');
  assert.ok(Number(lines[3]) >= 1000000, `uid ${lines[3]}`);
  assert.equal(r.stderr, 'oops\n');
  await assert.rejects(sbx.commands.run('echo partial; exit 3'), err => {
    assert.ok(err instanceof CommandExitError, String(err));
    assert.equal(err.exitCode, 3);
    assert.equal(err.stdout, 'partial\n');
    return true;
  });
});

test('commands.run: envs, cwd, python3 and git from the jail', { timeout: 60_000 }, async () => {
  const r = await sbx.commands.run('echo "$FOO"; pwd; python3 -c "print(6*7)"; git --version', {
    envs: { FOO: 'bar baz' }, cwd: '/tmp',
  });
  const lines = r.stdout.split('\n');
  assert.deepEqual(lines.slice(0, 3), ['bar baz', '/tmp', '42']);
  assert.match(lines[3], /^git version /);
  // The jail holds: no network, no sudo.
  const net = await sbx.commands.run('python3 -c "import socket; socket.socket(socket.AF_INET)" 2>&1; echo rc=$?');
  assert.match(net.stdout, /rc=1/);
});

test('background: list, connect, kill', { timeout: 60_000 }, async () => {
  const h = await sbx.commands.run('echo started; sleep 120', { background: true });
  assert.ok(h.pid > 1);
  const listed = await sbx.commands.list();
  const mine = listed.find(p => p.pid === h.pid);
  assert.ok(mine, JSON.stringify(listed));
  assert.equal(mine.cmd, '/bin/bash');
  const again = await sbx.commands.connect(h.pid);
  assert.equal(again.pid, h.pid);
  assert.equal(await sbx.commands.kill(h.pid), true);
  await assert.rejects(again.wait(), err => err instanceof CommandExitError);
  await assert.rejects(h.wait(), err => err instanceof CommandExitError);
  assert.equal(await sbx.commands.kill(h.pid), false);  // gone: not_found
  const after = await sbx.commands.list();
  assert.equal(after.find(p => p.pid === h.pid), undefined);
});

test('stdin: sendStdin and closeStdin', { timeout: 60_000 }, async () => {
  const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true });
  await sbx.commands.sendStdin(h.pid, 'line one\n');
  await sbx.commands.sendStdin(h.pid, 'line two\n');
  await sbx.commands.closeStdin(h.pid);
  const r = await h.wait();
  assert.equal(r.stdout, 'line one\nline two\ndone\n');
});

test('pty: create, sendInput, resize, kill', { timeout: 60_000 }, async () => {
  let seen = '';
  const decoder = new TextDecoder();
  const waitFor = async (re, what) => {
    const deadline = Date.now() + 30_000;
    while (!re.test(seen)) {
      assert.ok(Date.now() < deadline, `no ${what} in ${JSON.stringify(seen.slice(-500))}`);
      await new Promise(resolve => setTimeout(resolve, 20));
    }
  };
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: d => { seen += decoder.decode(d); } });
  const enc = new TextEncoder();
  await sbx.pty.sendInput(term.pid, enc.encode('tty; stty size\n'));
  await waitFor(/24 80/, 'first size');
  assert.match(seen, /\/dev\/pts\/\d+/);
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'));
  await waitFor(/30 100/, 'size after resize');
  assert.equal(await sbx.pty.kill(term.pid), true);
  await assert.rejects(term.wait());
});

test('a flood of output arrives whole and the gateway stays bounded', { timeout: 120_000 }, async () => {
  const before = await gatewayRssKiB();
  let bytes = 0;
  const r = await sbx.commands.run('head -c 60000000 /dev/zero | tr "\\0" x; echo', {
    onStdout: d => { bytes += d.length; }, timeoutMs: 110_000,
  });
  assert.equal(r.exitCode, 0);
  assert.equal(bytes, 60_000_001);
  const grown = (await gatewayRssKiB()) - before;
  assert.ok(grown < 64 * 1024, `the gateway grew by ${grown} KiB while streaming 60 MB`);
});

test('deleting the sandbox cuts its streams; /health answers 502', { timeout: 60_000 }, async () => {
  const victim = await newSandbox();
  const h = await victim.commands.run('sleep 120', { background: true });
  const waited = h.wait().then(() => null, err => err);
  const deleted = await api('DELETE', `/api/kernels/${victim.sandboxId}`);
  assert.equal(deleted.status, 204);
  const err = await waited;
  assert.ok(err, 'the command ended cleanly');
  assert.ok(!(err instanceof CommandExitError), `ended cleanly: ${err}`);
  // The SDK saw the body cut, probed /health (502) and says what E2B says.
  assert.equal(err.name, 'TimeoutError', String(err));
  assert.match(String(err), /sandbox was killed or reached its end of life/, String(err));
  assert.equal(await victim.isRunning(), false);
  // The other sandbox runs on.
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n');
});

test('a client that stops reading holds the command back; once it leaves, the command runs on', { timeout: 90_000 }, async () => {
  await sbx.commands.run('rm -f /tmp/flood-done');
  const before = await gatewayRssKiB();
  // Start through the raw Connect protocol: the SDK always reads its streams.
  const body = Buffer.from(JSON.stringify({
    process: { cmd: '/bin/bash', args: ['-l', '-c', 'head -c 400000000 /dev/zero; touch /tmp/flood-done'] },
  }));
  const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), body]);
  envelope.writeUInt32BE(body.length, 1);
  const controller = new AbortController();
  const res = await fetch(`http://127.0.0.1:${gw.e2bPort}/process.Process/Start`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1',
      'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': gw.token,
    },
    body: envelope,
    signal: controller.signal,
  });
  assert.equal(res.status, 200);
  // Unread for a while: the command must not get far through its 400 MB, nor the gateway grow.
  const listed = async () => (await sbx.commands.list()).filter(p => p.args.join(' ').includes('400000000'));
  const deadline = Date.now() + 3_000;
  while (Date.now() < deadline) {
    assert.equal((await listed()).length, 1, 'the flooding command ended while its client read nothing');
    await new Promise(resolve => setTimeout(resolve, 250));
  }
  assert.equal((await sbx.commands.run('test -e /tmp/flood-done && echo done || echo held')).stdout, 'held\n');
  const grown = (await gatewayRssKiB()) - before;
  assert.ok(grown < 64 * 1024, `the gateway grew by ${grown} KiB for a client that reads nothing`);
  // The client leaves: the command is not killed, its output is dropped, it finishes.
  controller.abort();
  const done = Date.now() + 60_000;
  while ((await listed()).length > 0) {
    assert.ok(Date.now() < done, 'the command never finished after its client left');
    await new Promise(resolve => setTimeout(resolve, 100));
  }
  assert.equal((await sbx.commands.run('test -e /tmp/flood-done && echo done')).stdout, 'done\n');
});

test('filesystem: exists, getInfo, list, makeDir, rename, remove, in the jail', { timeout: 60_000 }, async () => {
  await sbx.commands.run('mkdir -p fsdir && echo hi > fsdir/a.txt && ln -sf a.txt fsdir/link');
  assert.equal(await sbx.files.exists('fsdir/a.txt'), true);
  assert.equal(await sbx.files.exists('/home/user/nope'), false);
  const info = await sbx.files.getInfo('/home/user/fsdir/a.txt');
  assert.equal(info.type, 'file');
  assert.equal(Number(info.size), 3);
  assert.equal(info.path, '/home/user/fsdir/a.txt');
  const listed = await sbx.files.list('/home/user/fsdir');
  assert.deepEqual(listed.map(e => e.name).sort(), ['a.txt', 'link']);
  assert.equal(await sbx.files.makeDir('/home/user/fsdir/sub/deeper'), true);
  assert.equal(await sbx.files.makeDir('/home/user/fsdir/sub/deeper'), false);
  const moved = await sbx.files.rename('/home/user/fsdir/a.txt', '/home/user/fsdir/sub/b.txt');
  assert.equal(moved.path, '/home/user/fsdir/sub/b.txt');
  assert.equal((await sbx.commands.run('cat fsdir/sub/b.txt')).stdout, 'hi\n');
  await sbx.files.remove('/home/user/fsdir');
  assert.equal(await sbx.files.exists('/home/user/fsdir'), false);
  // The jail's tree, not the host's, and its read-only /usr.
  assert.equal(await sbx.files.exists('/etc/shadow'), false);
  await assert.rejects(sbx.files.remove('/usr/bin/python3'));
});

test('input to a process that closed its stdin is an error, not the end of the gateway', { timeout: 60_000 }, async () => {
  const h = await sbx.commands.run('exec 0<&-; echo closed; sleep 60', { background: true, stdin: true });
  const deadline = Date.now() + 30_000;
  while (!h.stdout.includes('closed')) {
    assert.ok(Date.now() < deadline, 'the command never closed its stdin');
    await new Promise(resolve => setTimeout(resolve, 20));
  }
  await assert.rejects(sbx.commands.sendStdin(h.pid, 'x'.repeat(100_000)));
  assert.equal(gw.proc.exitCode, null, logTail());
  assert.equal((await sbx.commands.run('echo still here')).stdout, 'still here\n');
  await sbx.commands.kill(h.pid);
});

test('files: write (multipart, several at once), read, empty, missing, in the jail', { timeout: 60_000 }, async () => {
  const info = await sbx.files.write('/home/user/up/hello.txt', 'hello world');
  assert.equal(info.path, '/home/user/up/hello.txt');
  assert.equal(await sbx.files.read('/home/user/up/hello.txt'), 'hello world');
  assert.equal((await sbx.commands.run('cat up/hello.txt; stat -c %u up/hello.txt')).stdout,
               `hello world${(await sbx.commands.run('id -u')).stdout}`);
  const big = 'x'.repeat(3_000_000);
  await sbx.files.write('up/big.txt', big);
  assert.equal((await sbx.files.read('up/big.txt')).length, 3_000_000);
  await sbx.files.write([{ path: 'up/a.txt', data: 'A' }, { path: 'up/b.txt', data: 'B' }]);
  assert.equal(await sbx.files.read('up/a.txt'), 'A');
  assert.equal(await sbx.files.read('up/b.txt'), 'B');
  await sbx.files.write('up/empty.txt', '');
  assert.equal(await sbx.files.read('up/empty.txt'), '');
  await assert.rejects(sbx.files.read('up/none.txt'), err => /not found/i.test(String(err)));
  // The jail decides: the host's files are not there, /usr is read-only.
  await assert.rejects(sbx.files.read('/etc/shadow'), err => /not found/i.test(String(err)));
  await assert.rejects(sbx.files.write('/usr/bin/evil', 'x'));
  await sbx.files.remove('up');
});

// Polls `probe` (an event's arrival) until it holds, against a generous deadline.
async function until(probe, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  while (!(await probe())) {
    assert.ok(Date.now() < deadline, `${what}: not within ${ms} ms\n${logTail()}`);
    await new Promise(resolve => setTimeout(resolve, 20));
  }
}

// Host pids whose argv `match`es (the jail's processes are the host's too, in a pid namespace of
// their own).
async function hostPids(match) {
  const out = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) {
      continue;
    }
    const argv = (await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '')).split('\0');
    if (match(argv)) {
      out.push(Number(name));
    }
  }
  return out;
}

test('watchDir: create, write, rename, remove, recursive into a directory made later; stop ends the watcher', { timeout: 90_000 }, async () => {
  const dir = `watched-${randomBytes(4).toString('hex')}`;
  await sbx.files.makeDir(`/home/user/${dir}`);
  const events = [];
  let exited = null;
  const handle = await sbx.files.watchDir(`/home/user/${dir}`, e => { events.push(e); }, {
    recursive: true, includeEntry: true, onExit: err => { exited = err ?? 'clean'; },
  });
  const saw = (name, type) => until(() => events.some(e => e.name === name && e.type === type),
    `${type} ${name} (events: ${JSON.stringify(events.map(e => [e.name, e.type]))})`);
  await sbx.files.write(`/home/user/${dir}/a.txt`, 'one');
  await saw('a.txt', 'create');
  await saw('a.txt', 'write');
  const created = events.find(e => e.name === 'a.txt' && e.type === 'create');
  assert.equal(created.entry?.path, `/home/user/${dir}/a.txt`);
  await sbx.files.rename(`/home/user/${dir}/a.txt`, `/home/user/${dir}/b.txt`);
  await saw('a.txt', 'rename');
  await saw('b.txt', 'create');
  await sbx.commands.run(`chmod 600 ${dir}/b.txt`);
  await saw('b.txt', 'chmod');
  await sbx.files.remove(`/home/user/${dir}/b.txt`);
  await saw('b.txt', 'remove');
  // Recursive: a directory made after the watch started is watched too.
  await sbx.files.makeDir(`/home/user/${dir}/sub`);
  await saw('sub', 'create');
  await sbx.files.write(`/home/user/${dir}/sub/c.txt`, 'deep');
  await saw('sub/c.txt', 'create');
  // A tree made in one go: its directories are watched only once their CREATE is read, so what
  // was made in them before comes from a scan. Each path is reported once (the sentinel comes
  // after any second copy).
  await sbx.commands.run(`mkdir -p ${dir}/t/u/v && touch ${dir}/t/u/v/f.txt ${dir}/t/g.txt`);
  await sbx.files.write(`/home/user/${dir}/sentinel`, 's');
  await saw('sentinel', 'create');
  for (const name of ['t', 't/u', 't/u/v', 't/u/v/f.txt', 't/g.txt']) {
    const copies = events.filter(e => e.name === name && e.type === 'create');
    assert.equal(copies.length, 1, `${name}: ${JSON.stringify(events.map(e => [e.name, e.type]))}`);
  }
  assert.equal(events.find(e => e.name === 't/u/v/f.txt').entry?.path, `/home/user/${dir}/t/u/v/f.txt`);
  // The watcher runs in the jail; stopping the handle ends its stream and kills it.
  const watchers = () => hostPids(argv => argv.includes('watch') && argv.some(a => a.includes(dir)));
  assert.ok((await watchers()).length >= 1, 'no watcher process seen from the host');
  await handle.stop();
  await until(async () => (await watchers()).length === 0, 'the watcher outlived its stream');
  assert.equal(gw.proc.exitCode, null, logTail());
  await sbx.files.remove(`/home/user/${dir}`);
});

test('watchDir: a missing directory is FileNotFoundError, a file InvalidArgumentError', { timeout: 60_000 }, async () => {
  await assert.rejects(sbx.files.watchDir('/home/user/no-such-dir', () => {}),
    err => err instanceof FileNotFoundError || (assert.fail(String(err)), false));
  await sbx.files.write('/home/user/plain.txt', 'x');
  await assert.rejects(sbx.files.watchDir('/home/user/plain.txt', () => {}),
    err => err instanceof InvalidArgumentError || (assert.fail(String(err)), false));
  // Not recursive: a subdirectory's files are not reported, the directory's own are.
  const dir = `flat-${randomBytes(4).toString('hex')}`;
  await sbx.commands.run(`mkdir -p ${dir}/inner`);
  const events = [];
  const handle = await sbx.files.watchDir(`/home/user/${dir}`, e => { events.push(e); });
  await sbx.commands.run(`touch ${dir}/inner/hidden.txt; touch ${dir}/shown.txt`);
  await until(() => events.some(e => e.name === 'shown.txt'), 'shown.txt');
  assert.equal(events.find(e => e.name.includes('hidden')), undefined, JSON.stringify(events));
  await handle.stop();
  await sbx.files.remove(`/home/user/${dir}`);
});

test('watchDir: deleting the sandbox cuts the watch (onExit gets the SDK\'s "killed" error)', { timeout: 60_000 }, async () => {
  const victim = await newSandbox();
  await victim.files.makeDir('/home/user/w');
  let exited;
  const ended = new Promise(resolve => { exited = resolve; });
  await victim.files.watchDir('/home/user/w', () => {}, { onExit: err => exited(err ?? null) });
  const deleted = await api('DELETE', `/api/kernels/${victim.sandboxId}`);
  assert.equal(deleted.status, 204);
  const err = await ended;
  assert.ok(err, 'the watch ended cleanly');
  assert.equal(err.name, 'TimeoutError', String(err));
  assert.match(String(err), /sandbox was killed or reached its end of life/, String(err));
});

// GET /files with Accept-Encoding as given, read raw (no decoding by the client).
function rawGet(route, headers) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: gw.e2bPort, path: route, headers: {
      'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': gw.token, ...headers,
    } }, res => {
      const chunks = [];
      res.on('data', c => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    }).on('error', reject);
  });
}

async function gzipOfZeros(bytes) {
  const z = createGzip({ level: 9 });
  const out = [];
  z.on('data', c => out.push(c));
  const ended = new Promise(resolve => z.on('end', resolve));
  const mib = Buffer.alloc(1 << 20);
  for (let i = 0; i < bytes / mib.length; i++) {
    if (!z.write(mib)) {
      await new Promise(resolve => z.once('drain', resolve));
    }
  }
  z.end();
  await ended;
  return Buffer.concat(out);
}

test('files: gzip both ways (the SDK\'s gzip: true); a gzip bomb is 413 and the gateway stays bounded', { timeout: 120_000 }, async () => {
  const text = 'gzip me, please; '.repeat(200_000);
  const written = await sbx.files.write('gz/a.txt', text, { gzip: true });
  assert.equal(written.path, '/home/user/gz/a.txt');
  assert.equal((await sbx.commands.run('wc -c < gz/a.txt')).stdout.trim(), String(text.length));
  assert.equal(await sbx.files.read('gz/a.txt', { gzip: true }), text);
  // On the wire: gzip, and far smaller.
  const raw = await rawGet('/files?path=gz%2Fa.txt', { 'Accept-Encoding': 'gzip' });
  assert.equal(raw.status, 200);
  assert.equal(raw.headers['content-encoding'], 'gzip');
  assert.ok(raw.body.length < text.length / 20, `${raw.body.length} bytes of gzip`);
  assert.equal(gunzipSync(raw.body).toString(), text);
  const plain = await rawGet('/files?path=gz%2Fa.txt', { 'Accept-Encoding': 'identity' });
  assert.equal(plain.headers['content-encoding'], undefined);
  assert.equal(plain.body.toString(), text);
  // 512 MiB of zeros in half a MiB: refused past the body limit, never inflated whole.
  const bomb = await gzipOfZeros(512 << 20);
  const before = await gatewayRssKiB();
  const res = await fetch(`http://127.0.0.1:${gw.e2bPort}/files?path=gz/bomb`, {
    method: 'POST', body: bomb,
    headers: {
      'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip',
      'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': gw.token,
    },
  });
  const answer = await res.json();
  assert.equal(res.status, 413, JSON.stringify(answer));
  assert.equal(answer.code, 413);
  assert.match(answer.message, /inflates past/);
  const grown = (await gatewayRssKiB()) - before;
  assert.ok(grown < 48 * 1024, `the gateway grew by ${grown} KiB for a gzip bomb`);
  assert.equal(await sbx.files.exists('gz/bomb'), false);
  // Not gzip at all: 400; the gateway runs on.
  const junk = await fetch(`http://127.0.0.1:${gw.e2bPort}/files?path=gz/junk`, {
    method: 'POST', body: 'not gzip',
    headers: {
      'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip',
      'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': gw.token,
    },
  });
  assert.equal(junk.status, 400);
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n');
  await sbx.files.remove('gz');
});
