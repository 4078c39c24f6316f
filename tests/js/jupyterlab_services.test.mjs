// JupyterLab's own client library, @jupyterlab/services 7.x, pointed straight at `cellgate serve`.
//
// One gateway for the whole file (temp state dir, random token, port 0); each test starts the
// kernels it needs and shuts them down. Only the individual managers are used
// (KernelSpecManager, KernelManager, SessionManager): a full ServiceManager would poll routes
// a gateway does not have (/api/contents, /lab/api/settings, ...).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import WebSocket from 'ws';
import services from '@jupyterlab/services';

const { KernelAPI, KernelManager, KernelSpecManager, ServerConnection, SessionManager } = services;

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');
const V1 = 'v1.kernel.websocket.jupyter.org';

// JupyterLab logs every WebSocket it opens with console.debug; keep the test output readable.
console.debug = () => {};

// ---- the gateway ----------------------------------------------------------------------------

const gw = { proc: null, dir: null, port: 0, token: '', baseUrl: '', wsUrl: '', log: [] };

function logTail(n = 40) {
  return gw.log.join('').split('\n').slice(-n).join('\n');
}

async function startGateway() {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-js-'));
  gw.token = randomBytes(16).toString('hex');
  const bin = path.join(BIN_DIR, 'cellgate');
  gw.proc = spawn(
    bin,
    ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
     '--state-dir', path.join(gw.dir, 'state')],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  gw.exited = new Promise(resolve => gw.proc.once('exit', (code, signal) => resolve({ code, signal })));
  gw.proc.stderr.on('data', d => gw.log.push(d.toString()));
  gw.port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no "listening on" line within 30 s:\n${out}\n${logTail()}`)), 30_000);
    gw.proc.once('error', e => { clearTimeout(timer); reject(e); });
    gw.exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`cellgate serve exited (${code ?? signal}) before listening:\n${out}\n${logTail()}`));
    });
    gw.proc.stdout.on('data', d => {
      out += d.toString();
      gw.log.push(d.toString());
      const m = /cellgate serve: listening on http:\/\/127\.0\.0\.1:(\d+)\//.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
  });
  gw.baseUrl = `http://127.0.0.1:${gw.port}/`;
  gw.wsUrl = `ws://127.0.0.1:${gw.port}/`;
}

async function stopGateway() {
  if (gw.proc && gw.proc.exitCode === null && gw.proc.signalCode === null) {
    gw.proc.kill('SIGTERM');
    const done = await withTimeout(gw.exited, 30_000, 'exit after SIGTERM').catch(() => null);
    if (done === null) {
      gw.proc.kill('SIGKILL');
      await gw.exited;
      throw new Error(`cellgate serve did not exit within 30 s of SIGTERM\n${logTail()}`);
    }
    if (done.code !== 0) {
      throw new Error(`cellgate serve exited with ${done.code ?? done.signal} after SIGTERM\n${logTail()}`);
    }
  }
  if (gw.dir) {
    await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  }
}

before(startGateway, { timeout: 40_000 });
after(stopGateway, { timeout: 40_000 });

// ---- helpers --------------------------------------------------------------------------------

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// Every socket JupyterLab opens, so a test can look at what was negotiated.
const sockets = [];

/** ws, recording itself; JupyterLab offers its subprotocol list. */
class RecordingWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(url, protocols);
    this.offered = Array.isArray(protocols) ? [...protocols] : protocols ? [protocols] : [];
    sockets.push(this);
  }
}

/** ws that never offers a subprotocol: the legacy JSON / binary format, like jupyter_server's proxy. */
class LegacyWebSocket extends WebSocket {
  constructor(url, _protocols) {
    super(url);
    this.offered = [];
    sockets.push(this);
  }
}

function settings(overrides = {}) {
  return ServerConnection.makeSettings({
    baseUrl: gw.baseUrl,
    wsUrl: gw.wsUrl,
    token: gw.token,
    appendToken: true,
    WebSocket: RecordingWebSocket,
    fetch,
    Request,
    Headers,
    ...overrides,
  });
}

/** A raw HTTP request through JupyterLab's ServerConnection (token header, cache-buster). */
function request(pathname, init = {}, s = settings()) {
  return ServerConnection.makeRequest(new URL(pathname, gw.baseUrl).href, init, s);
}

/**
 * Disposes a JupyterLab manager. @lumino/polling's Poll.dispose() leaves its next tick's timer
 * armed (harmless in a browser, but it keeps Node alive for up to 61 s), so stop the manager's
 * polls first: Poll.stop() clears the timer.
 */
async function disposeManager(manager) {
  for (const value of Object.values(manager)) {
    if (value && typeof value.stop === 'function' && 'frequency' in value && 'tick' in value) {
      await value.stop();
    }
  }
  manager.dispose();
}

async function waitForConnected(kernel, ms = 30_000) {
  if (kernel.connectionStatus === 'connected') {
    return;
  }
  await withTimeout(new Promise(resolve => {
    const check = () => {
      if (kernel.connectionStatus === 'connected') {
        kernel.connectionStatusChanged.disconnect(check);
        resolve();
      }
    };
    kernel.connectionStatusChanged.connect(check);
    check();
  }), ms, `kernel ${kernel.id} WebSocket connection`);
}

/**
 * Starts a kernel through a KernelManager, waits for kernel_info, runs fn, and shuts it down.
 */
async function withKernel(fn, { webSocket = RecordingWebSocket, name = 'python3' } = {}) {
  const serverSettings = settings({ WebSocket: webSocket });
  const manager = new KernelManager({ serverSettings });
  let kernel;
  try {
    await withTimeout(manager.ready, 20_000, 'KernelManager.ready');
    kernel = await withTimeout(manager.startNew({ name }), 60_000, 'KernelManager.startNew');
    await withTimeout(kernel.info, 60_000, 'kernel_info_reply');
    return await fn(kernel, manager, serverSettings);
  } finally {
    if (kernel && !kernel.isDisposed) {
      await withTimeout(kernel.shutdown(), 30_000, 'kernel.shutdown').catch(e => {
        console.error(`shutdown of ${kernel.id} failed: ${e}`);
      });
    }
    await disposeManager(manager);
  }
}

/** Runs code; resolves with the reply, every iopub message, and the stdout text. */
async function execute(kernel, code, { allowStdin = false, onStdin, ms = 30_000, onFuture } = {}) {
  const future = kernel.requestExecute({ code, allow_stdin: allowStdin, stop_on_error: false });
  const iopub = [];
  future.onIOPub = msg => { iopub.push(msg); };
  if (onStdin) {
    future.onStdin = msg => onStdin(msg);
  }
  if (onFuture) {
    onFuture(future, iopub);
  }
  const reply = await withTimeout(future.done, ms, `execute ${JSON.stringify(code)}`);
  const stdout = iopub
    .filter(m => m.header.msg_type === 'stream' && m.content.name === 'stdout')
    .map(m => m.content.text)
    .join('');
  return { reply, iopub, stdout };
}

function describeIopub(iopub) {
  return JSON.stringify(iopub.map(m => [m.header.msg_type, m.content]), null, 1).slice(0, 4000);
}

function bytesOf(buf) {
  if (buf instanceof ArrayBuffer) {
    return new Uint8Array(buf);
  }
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
}

// ---- 1. kernelspecs -------------------------------------------------------------------------

test('kernelspecs: python3 present, default set, logo fetchable', { timeout: 30_000 }, async () => {
  const manager = new KernelSpecManager({ serverSettings: settings() });
  try {
    await withTimeout(manager.ready, 20_000, 'KernelSpecManager.ready');
    const specs = manager.specs;
    assert.ok(specs, 'KernelSpecManager has no specs');
    assert.ok(specs.kernelspecs.python3, `no python3 in ${Object.keys(specs.kernelspecs)}`);
    assert.equal(specs.default, 'python3');
    const py = specs.kernelspecs.python3;
    assert.equal(py.language, 'python');
    assert.ok(Array.isArray(py.argv));
    const logo = py.resources['logo-64x64'];
    assert.ok(logo, `no logo-64x64 in resources ${JSON.stringify(py.resources)}`);
    assert.match(logo, /\/kernelspecs\/python3\/logo-64x64\.png$/);
    const res = await request(logo);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'image/png');
    const body = new Uint8Array(await res.arrayBuffer());
    assert.deepEqual([...body.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47], 'not a PNG');
  } finally {
    await disposeManager(manager);
  }
});

// ---- 2-8. one kernel at a time --------------------------------------------------------------

test('execute: state kept across cells, stream and execute_result', { timeout: 90_000 }, async () => {
  await withKernel(async kernel => {
    const a = await execute(kernel, 'x = 41');
    assert.equal(a.reply.content.status, 'ok');
    const b = await execute(kernel, 'print(x + 1)');
    assert.equal(b.reply.content.status, 'ok');
    assert.equal(b.stdout, '42\n', describeIopub(b.iopub));
    const c = await execute(kernel, '6*7');
    const result = c.iopub.find(m => m.header.msg_type === 'execute_result');
    assert.ok(result, `no execute_result: ${describeIopub(c.iopub)}`);
    assert.equal(result.content.data['text/plain'], '42');
    assert.equal(result.content.execution_count, c.reply.content.execution_count);
    // Every iopub message of a cell is a child of that cell's request.
    for (const m of c.iopub) {
      assert.equal(m.parent_header.msg_id, c.reply.parent_header.msg_id);
    }
  });
});

test('execute: an error reply with ename and traceback', { timeout: 90_000 }, async () => {
  await withKernel(async kernel => {
    const { reply, iopub } = await execute(kernel, '1/0');
    assert.equal(reply.content.status, 'error');
    assert.equal(reply.content.ename, 'ZeroDivisionError');
    assert.ok(Array.isArray(reply.content.traceback) && reply.content.traceback.length > 0,
      `traceback: ${JSON.stringify(reply.content.traceback)}`);
    const err = iopub.find(m => m.header.msg_type === 'error');
    assert.ok(err, `no iopub error: ${describeIopub(iopub)}`);
    assert.equal(err.content.ename, 'ZeroDivisionError');
  });
});

test('execute: a matplotlib plot arrives as display_data image/png', { timeout: 150_000 }, async () => {
  await withKernel(async kernel => {
    const code = [
      '%matplotlib inline',
      'import matplotlib.pyplot as plt',
      'plt.plot([1, 2, 3], [1, 4, 9])',
      'plt.show()',
    ].join('\n');
    const { reply, iopub } = await execute(kernel, code, { ms: 120_000 });
    assert.equal(reply.content.status, 'ok', JSON.stringify(reply.content).slice(0, 2000));
    const shown = iopub.find(m => m.header.msg_type === 'display_data' && m.content.data['image/png']);
    assert.ok(shown, `no display_data with image/png: ${describeIopub(iopub).slice(0, 1000)}`);
    assert.ok(shown.content.data['image/png'].startsWith('iVBORw0KGgo'));
  });
});

test('stdin: input() answered through future.onStdin', { timeout: 90_000 }, async () => {
  await withKernel(async kernel => {
    const prompts = [];
    const { reply, stdout, iopub } = await execute(
      kernel, 'name = input("who? ")\nprint("hi", name)', {
        allowStdin: true,
        onStdin: msg => {
          if (msg.header.msg_type === 'input_request') {
            prompts.push(msg.content.prompt);
            kernel.sendInputReply({ status: 'ok', value: 'cellgate' }, msg.header);
          }
        },
      });
    assert.deepEqual(prompts, ['who? ']);
    assert.equal(reply.content.status, 'ok', JSON.stringify(reply.content).slice(0, 2000));
    assert.equal(stdout, 'hi cellgate\n', describeIopub(iopub));
  });
});

test('complete, inspect and is_complete requests', { timeout: 90_000 }, async () => {
  await withKernel(async kernel => {
    const complete = await withTimeout(
      kernel.requestComplete({ code: 'import o', cursor_pos: 8 }), 45_000, 'complete_request');
    assert.equal(complete.content.status, 'ok');
    assert.ok(complete.content.matches.includes('os'), `matches: ${complete.content.matches}`);

    const inspect = await withTimeout(
      kernel.requestInspect({ code: 'print', cursor_pos: 5, detail_level: 0 }), 30_000, 'inspect_request');
    assert.equal(inspect.content.status, 'ok');
    assert.equal(inspect.content.found, true);
    assert.ok(inspect.content.data['text/plain'], 'inspect returned no text/plain');

    const open = await withTimeout(
      kernel.requestIsComplete({ code: 'for i in range(3):' }), 30_000, 'is_complete_request');
    assert.equal(open.content.status, 'incomplete');
    const closed = await withTimeout(
      kernel.requestIsComplete({ code: 'x = 1' }), 30_000, 'is_complete_request');
    assert.equal(closed.content.status, 'complete');
  });
});

test('interrupt: a busy loop ends with KeyboardInterrupt, the kernel lives on', { timeout: 90_000 }, async () => {
  await withKernel(async kernel => {
    let started;
    const running = new Promise(resolve => { started = resolve; });
    const pending = execute(kernel, 'while True: pass', {
      onFuture: future => {
        const prev = future.onIOPub;
        future.onIOPub = msg => {
          prev(msg);
          if (msg.header.msg_type === 'execute_input') {
            started();
          }
        };
      },
    });
    await withTimeout(running, 30_000, 'execute_input of the busy loop');
    await sleep(1000);
    await withTimeout(kernel.interrupt(), 15_000, 'POST interrupt');
    const { reply, iopub } = await pending;
    assert.equal(reply.content.status, 'error', describeIopub(iopub));
    assert.equal(reply.content.ename, 'KeyboardInterrupt');
    const after = await execute(kernel, 'print("still here")');
    assert.equal(after.stdout, 'still here\n');
  });
});

// Debian's IRkernel (r-cran-irkernel installs the `ir` kernelspec), jailed like python3.
const HAS_IR = existsSync('/usr/share/jupyter/kernels/ir/kernel.json');

test('R (ir): state, a plot as image/png, an interrupted Sys.sleep', { timeout: 90_000, skip: HAS_IR ? false : 'no ir kernelspec (r-cran-irkernel)' }, async () => {
  await withKernel(async kernel => {
    const info = await kernel.info;
    assert.equal(info.language_info.name, 'R');
    await execute(kernel, 'x <- 41');
    const b = await execute(kernel, 'cat(x + 1, "\n")');
    assert.equal(b.stdout, '42 \n', describeIopub(b.iopub));
    const plot = await execute(kernel, 'plot(1:10)');
    const shown = plot.iopub.find(m => m.header.msg_type === 'display_data' && m.content.data['image/png']);
    assert.ok(shown, `no display_data with image/png: ${describeIopub(plot.iopub).slice(0, 1000)}`);
    assert.ok(shown.content.data['image/png'].startsWith('iVBORw0KGgo'));
    let started;
    const running = new Promise(resolve => { started = resolve; });
    const pending = execute(kernel, 'Sys.sleep(60)', {
      onFuture: future => {
        const prev = future.onIOPub;
        future.onIOPub = msg => {
          prev(msg);
          if (msg.header.msg_type === 'execute_input') {
            started();
          }
        };
      },
    });
    await withTimeout(running, 30_000, 'execute_input of Sys.sleep');
    await sleep(500);
    await withTimeout(kernel.interrupt(), 15_000, 'POST interrupt');
    const { reply } = await withTimeout(pending, 15_000, 'the interrupted Sys.sleep');
    assert.equal(reply.content.status, 'abort');  // IRkernel's answer to an interrupt
    const after = await execute(kernel, 'cat(x, "\n")');
    assert.equal(after.stdout, '41 \n');
  }, { name: 'ir' });
});

test('restart: state is gone and the kernel answers', { timeout: 120_000 }, async () => {
  await withKernel(async kernel => {
    assert.equal((await execute(kernel, 'x = 1')).reply.content.status, 'ok');
    await withTimeout(kernel.restart(), 60_000, 'POST restart');
    await waitForConnected(kernel);
    const { reply } = await execute(kernel, 'print(x)');
    assert.equal(reply.content.status, 'error');
    assert.equal(reply.content.ename, 'NameError');
    const info = await withTimeout(kernel.requestKernelInfo(), 30_000, 'kernel_info after restart');
    assert.equal(info.content.status, 'ok');
    assert.equal(info.content.language_info.name, 'python');
    const again = await execute(kernel, 'print(2 + 3)');
    assert.equal(again.stdout, '5\n');
  });
});

test('shutdown: the kernel is gone from GET one and from the list', { timeout: 90_000 }, async () => {
  const serverSettings = settings();
  const manager = new KernelManager({ serverSettings });
  try {
    await withTimeout(manager.ready, 20_000, 'KernelManager.ready');
    const kernel = await withTimeout(manager.startNew({ name: 'python3' }), 60_000, 'startNew');
    await withTimeout(kernel.info, 60_000, 'kernel_info_reply');
    const id = kernel.id;
    const before = await KernelAPI.listRunning(serverSettings);
    assert.ok(before.some(k => k.id === id), 'the new kernel is not listed');
    await withTimeout(kernel.shutdown(), 30_000, 'kernel.shutdown');
    const one = await request(`api/kernels/${id}`);
    assert.equal(one.status, 404);
    assert.equal(await KernelAPI.getKernelModel(id, serverSettings), undefined);
    const list = await KernelAPI.listRunning(serverSettings);
    assert.ok(!list.some(k => k.id === id), `still listed: ${JSON.stringify(list)}`);
  } finally {
    await disposeManager(manager);
  }
});

// ---- 10. sessions ---------------------------------------------------------------------------

test('sessions: start, same path same session, PATCH path and name, list, DELETE', { timeout: 90_000 }, async () => {
  const serverSettings = settings();
  const kernelManager = new KernelManager({ serverSettings });
  const sessions = new SessionManager({ kernelManager, serverSettings });
  let session;
  try {
    await withTimeout(sessions.ready, 20_000, 'SessionManager.ready');
    const options = { path: 'a.ipynb', type: 'notebook', name: 'a.ipynb', kernel: { name: 'python3' } };
    session = await withTimeout(sessions.startNew(options), 60_000, 'SessionManager.startNew');
    assert.equal(session.path, 'a.ipynb');
    assert.equal(session.type, 'notebook');
    assert.equal(session.name, 'a.ipynb');
    assert.ok(session.kernel, 'the session has no kernel');
    assert.equal(session.kernel.name, 'python3');
    const kernelId = session.kernel.id;
    await withTimeout(session.kernel.info, 60_000, 'kernel_info through the session');

    const again = await withTimeout(sessions.startNew(options), 60_000, 'second startNew');
    assert.equal(again.id, session.id, 'the same path gave a different session');
    assert.equal(again.kernel.id, kernelId);
    again.dispose();

    await session.setPath('b.ipynb');
    assert.equal(session.path, 'b.ipynb');
    await session.setName('b.ipynb');
    assert.equal(session.name, 'b.ipynb');
    const raw = await (await request(`api/sessions/${session.id}`)).json();
    assert.equal(raw.path, 'b.ipynb');
    assert.equal(raw.name, 'b.ipynb');
    assert.equal(raw.kernel.id, kernelId);

    await sessions.refreshRunning();
    const running = [...sessions.running()];
    const listed = running.find(m => m.id === session.id);
    assert.ok(listed, `not listed: ${JSON.stringify(running)}`);
    assert.equal(listed.path, 'b.ipynb');

    await withTimeout(session.shutdown(), 30_000, 'session.shutdown');
    session = undefined;
    await sessions.refreshRunning();
    assert.ok(![...sessions.running()].some(m => m.id === raw.id), 'session still listed after DELETE');
    assert.equal((await request(`api/sessions/${raw.id}`)).status, 404);
    assert.equal((await request(`api/kernels/${kernelId}`)).status, 404, 'the session kernel outlived DELETE');
  } finally {
    if (session) {
      await session.shutdown().catch(() => {});
    }
    await disposeManager(sessions);
    await disposeManager(kernelManager);
  }
});

// ---- 11. both WebSocket formats -------------------------------------------------------------

const ECHO_TARGET = [
  'def _cellgate_echo(comm, open_msg):',
  '    def _on_msg(msg):',
  '        data = msg["content"]["data"]',
  '        bufs = [bytes(b)[::-1] for b in msg.get("buffers") or []]',
  '        comm.send({"echo": data, "nbuf": len(bufs)}, buffers=bufs)',
  '    comm.on_msg(_on_msg)',
  'get_ipython().kernel.comm_manager.register_target("cellgate_echo", _cellgate_echo)',
].join('\n');

/** Opens a comm to the echo target, sends a message with one buffer, checks the reversed echo. */
async function commEcho(kernel, label) {
  const comm = kernel.createComm('cellgate_echo');
  try {
    const echoed = new Promise(resolve => { comm.onMsg = msg => resolve(msg); });
    await withTimeout(comm.open({}).done, 30_000, `${label}: comm_open`);
    const payload = new Uint8Array([0, 1, 2, 3, 254, 255]);
    comm.send({ label }, undefined, [payload.buffer]);
    const msg = await withTimeout(echoed, 30_000, `${label}: comm_msg echo`);
    assert.deepEqual(msg.content.data.echo, { label });
    assert.equal(msg.content.data.nbuf, 1);
    assert.ok(msg.buffers && msg.buffers.length === 1, `${label}: no buffer came back`);
    assert.deepEqual([...bytesOf(msg.buffers[0])], [...payload].reverse());
  } finally {
    if (!comm.isDisposed) {
      comm.close();
    }
  }
}

function socketOf(kernel) {
  const mine = sockets.filter(ws => ws.url.includes(`/api/kernels/${kernel.id}/channels`) &&
    ws.url.includes(`session_id=${encodeURIComponent(kernel.clientId)}`));
  assert.ok(mine.length > 0, `no recorded WebSocket for kernel ${kernel.id}`);
  return mine[mine.length - 1];
}

test('websocket: v1 subprotocol negotiated, then legacy; a comm with a binary buffer in both', { timeout: 120_000 }, async () => {
  await withKernel(async (kernel, manager) => {
    await waitForConnected(kernel);
    const v1 = socketOf(kernel);
    assert.ok(v1.offered.includes(V1), `JupyterLab did not offer ${V1}: ${v1.offered}`);
    assert.equal(v1.protocol, V1, 'the gateway did not select the v1 subprotocol');
    const a = await execute(kernel, 'print("over v1")');
    assert.equal(a.stdout, 'over v1\n');
    assert.equal((await execute(kernel, ECHO_TARGET)).reply.content.status, 'ok');
    await commEcho(kernel, 'v1');

    // The same kernel again, through a socket that offers no subprotocol.
    const legacyManager = new KernelManager({ serverSettings: settings({ WebSocket: LegacyWebSocket }) });
    try {
      await withTimeout(legacyManager.ready, 20_000, 'legacy KernelManager.ready');
      const legacy = legacyManager.connectTo({ model: kernel.model });
      await withTimeout(legacy.info, 30_000, 'kernel_info over legacy');
      await waitForConnected(legacy);
      const ws = socketOf(legacy);
      assert.deepEqual(ws.offered, []);
      assert.equal(ws.protocol, '', 'the gateway selected a subprotocol nobody offered');
      // Same kernel: the comm target the v1 connection defined is there.
      const b = await execute(legacy, 'print("over legacy", "_cellgate_echo" in dir())');
      assert.equal(b.stdout, 'over legacy True\n');
      await commEcho(legacy, 'legacy');
      legacy.dispose();
    } finally {
      await disposeManager(legacyManager);
    }
  });
});

// ---- 12. auth -------------------------------------------------------------------------------

test('auth: no token 401, wrong token 403, WebSocket without token refused', { timeout: 60_000 }, async () => {
  const noToken = await request('api/kernels', {}, settings({ token: '' }));
  assert.equal(noToken.status, 401);
  const wrong = await request('api/kernels', {}, settings({ token: 'not-the-token' }));
  assert.equal(wrong.status, 403);
  await assert.rejects(KernelAPI.listRunning(settings({ token: '' })),
    e => e instanceof ServerConnection.ResponseError && e.response.status === 401);

  const model = await KernelAPI.startNew({ name: 'python3' }, settings());
  try {
    const url = `${gw.wsUrl}api/kernels/${model.id}/channels?session_id=${randomBytes(8).toString('hex')}`;
    const refused = status => new Promise((resolve, reject) => {
      const ws = new WebSocket(status.token ? `${url}&token=${status.token}` : url, [V1]);
      ws.on('unexpected-response', (_req, res) => { resolve(res.statusCode); res.resume(); ws.terminate(); });
      ws.on('open', () => { ws.close(); reject(new Error('the WebSocket was accepted')); });
      ws.on('error', () => {});
    });
    assert.equal(await withTimeout(refused({}), 10_000, 'WS without token'), 401);
    assert.equal(await withTimeout(refused({ token: 'nope' }), 10_000, 'WS with a wrong token'), 403);
    // The correct token is accepted (so the refusals above were about the token).
    const ok = await withTimeout(new Promise((resolve, reject) => {
      const ws = new WebSocket(`${url}&token=${gw.token}`, [V1]);
      ws.on('open', () => { resolve(ws.protocol); ws.close(); });
      ws.on('unexpected-response', (_req, res) => reject(new Error(`refused with ${res.statusCode}`)));
      ws.on('error', reject);
    }), 10_000, 'WS with the token');
    assert.equal(ok, V1);
  } finally {
    await KernelAPI.shutdownKernel(model.id, settings()).catch(() => {});
  }
});
