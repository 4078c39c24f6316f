// E2B's code-interpreter SDK, @e2b/code-interpreter 2.x, pointed at `cellgate serve`'s E2B listener.
//
// With E2B_DEBUG=true the SDK creates no cloud sandbox and sends every code-interpreter request to
// http://localhost:49999 (docs/e2b.md §1). In that mode it sends no access token at all (§2), so
// the gateway runs with --e2b-no-token; the token-bearing forms are checked with plain fetch.
//
// Flags this file assumes of `cellgate serve`:
//   --ip 127.0.0.1 --port 0 --token <t> --state-dir <d> --e2b-port 49999 --e2b-no-token
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { access, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { NotFoundError, Sandbox, SandboxError } from '@e2b/code-interpreter';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');
// The SDK's JUPYTER_PORT: fixed, not configurable in debug mode.
const E2B_PORT = 49999;
const E2B_URL = `http://127.0.0.1:${E2B_PORT}`;
const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

// Debug mode: Sandbox.create() makes no API call; the code interpreter is localhost:49999.
// E2B_SANDBOX_URL or E2B_API_URL from the environment would send requests elsewhere.
process.env.E2B_DEBUG = 'true';
delete process.env.E2B_SANDBOX_URL;
delete process.env.E2B_API_URL;

// ---- the gateway ----------------------------------------------------------------------------

const gw = { proc: null, dir: null, port: 0, token: '', log: [] };

function logTail(n = 40) {
  return gw.log.join('').split('\n').slice(-n).join('\n');
}

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

async function waitForE2bHealth(ms) {
  const deadline = Date.now() + ms;
  let last = '';
  while (Date.now() < deadline) {
    if (gw.proc.exitCode !== null || gw.proc.signalCode !== null) {
      throw new Error(`cellgate serve exited before the E2B listener answered\n${logTail()}`);
    }
    try {
      const res = await fetch(`${E2B_URL}/health`, { signal: AbortSignal.timeout(2000) });
      if (res.status === 200) {
        return;
      }
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = String(e.cause?.code ?? e);
    }
    await sleep(200);
  }
  throw new Error(`GET ${E2B_URL}/health never answered 200 (${last})\n${logTail()}`);
}

async function startGateway() {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-e2b-'));
  gw.token = randomBytes(16).toString('hex');
  gw.proc = spawn(
    path.join(BIN_DIR, 'cellgate'),
    ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token,
     '--state-dir', path.join(gw.dir, 'state'),
     '--e2b-port', String(E2B_PORT), '--e2b-no-token'],
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
  await waitForE2bHealth(30_000);
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

let sbx;

before(async () => {
  await startGateway();
  sbx = await Sandbox.create();
}, { timeout: 70_000 });

after(async () => {
  if (sbx) {
    await sbx.kill();  // debug mode: no request
  }
  await stopGateway();
}, { timeout: 40_000 });

// ---- helpers --------------------------------------------------------------------------------

function describe(execution) {
  return JSON.stringify({
    results: execution.results.map(r => ({ main: r.isMainResult, formats: r.formats(), text: r.text })),
    logs: execution.logs,
    error: execution.error,
    executionCount: execution.executionCount,
  }).slice(0, 3000);
}

/** runCode with a test-sized body timeout, failing on an ExecutionError unless told. */
async function run(code, opts = {}, { allowError = false } = {}) {
  const execution = await sbx.runCode(code, { timeoutMs: 60_000, ...opts });
  if (!allowError) {
    assert.equal(execution.error, undefined, `${JSON.stringify(code)}: ${describe(execution)}`);
  }
  return execution;
}

/** The NDJSON lines of a raw POST /execute. */
async function rawExecute(body, headers = {}) {
  const res = await fetch(`${E2B_URL}/execute`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  if (res.status !== 200) {
    return { status: res.status, text, lines: [] };
  }
  assert.ok(text.endsWith('\n'), `the stream does not end with a newline: ${JSON.stringify(text.slice(-200))}`);
  const lines = text.slice(0, -1).split('\n').map(line => JSON.parse(line));
  return { status: res.status, text, lines };
}

// ---- the default context --------------------------------------------------------------------

test('runCode: state kept between calls, the main result as text', { timeout: 120_000 }, async () => {
  const a = await run('x = 41');
  assert.equal(a.results.length, 0, describe(a));
  const b = await run('x + 1');
  assert.equal(b.text, '42', describe(b));
  const main = b.results.filter(r => r.isMainResult);
  assert.equal(main.length, 1, describe(b));
  assert.equal(main[0].text, '42');
  assert.equal(typeof b.executionCount, 'number', describe(b));
  assert.ok(b.executionCount > a.executionCount, `${a.executionCount} then ${b.executionCount}`);
  // A string's repr loses its quotes, as on E2B.
  const c = await run('"a" + "b"');
  assert.equal(c.text, 'ab', describe(c));
});

test('runCode: onStdout and onStderr get the printed text', { timeout: 60_000 }, async () => {
  const out = [];
  const err = [];
  const execution = await run(
    'import sys\nprint("hello out")\nprint("hello err", file=sys.stderr)',
    { onStdout: m => out.push(m), onStderr: m => err.push(m) });
  assert.equal(out.map(m => m.line).join(''), 'hello out\n');
  assert.equal(err.map(m => m.line).join(''), 'hello err\n');
  assert.ok(out.every(m => m.error === false && typeof m.timestamp === 'number'));
  assert.ok(err.every(m => m.error === true));
  assert.equal(execution.logs.stdout.join(''), 'hello out\n');
  assert.equal(execution.logs.stderr.join(''), 'hello err\n');
  assert.equal(execution.text, undefined, 'print has no main result');
});

test('runCode: a matplotlib chart comes back as a png result', { timeout: 150_000 }, async () => {
  const results = [];
  const execution = await run(
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()',
    { timeoutMs: 120_000, onResult: r => results.push(r) });
  const png = execution.results.find(r => r.png);
  assert.ok(png, `no png result: ${describe(execution)}`);
  assert.equal(png.isMainResult, false, 'a display, not the cell value');
  assert.ok(png.formats().includes('png'), String(png.formats()));
  const bytes = Buffer.from(png.png, 'base64');
  assert.deepEqual([...bytes.subarray(0, 8)], PNG_SIGNATURE, 'not a PNG');
  assert.ok(results.includes(png), 'onResult was not called with the png result');
});

test('runCode: an exception is execution.error, not a rejection', { timeout: 60_000 }, async () => {
  const errors = [];
  const execution = await run('1/0', { onError: e => errors.push(e) }, { allowError: true });
  assert.ok(execution.error, describe(execution));
  assert.equal(execution.error.name, 'ZeroDivisionError');
  assert.equal(execution.error.value, 'division by zero');
  assert.equal(typeof execution.error.traceback, 'string', 'E2B tracebacks are one string');
  assert.match(execution.error.traceback, /ZeroDivisionError/);
  assert.doesNotMatch(execution.error.traceback, /\x1b\[/, 'ANSI escapes left in the traceback');
  assert.deepEqual(errors, [execution.error]);
  // The context lives on.
  assert.equal((await run('2 + 2')).text, '4');
});

test('runCode: envs are set for that call only', { timeout: 60_000 }, async () => {
  const value = 'it\'s "quoted" \\ back\\slash\nsecond line \u00e9 \u{1F600}';
  const during = await run(
    'import os\nprint(os.environ["CG_E2B_VAR"], end="")',
    { envs: { CG_E2B_VAR: value, CG_E2B_OTHER: '' } });
  assert.equal(during.logs.stdout.join(''), value);
  const later = await run('import os\nprint(repr(os.environ.get("CG_E2B_VAR")), "CG_E2B_OTHER" in os.environ)');
  assert.equal(later.logs.stdout.join(''), 'None False\n');
  // A variable the context set itself comes back after a call that overrode it.
  await run('import os\nos.environ["CG_E2B_KEEP"] = "mine"');
  const over = await run('import os\nprint(os.environ["CG_E2B_KEEP"], end="")', { envs: { CG_E2B_KEEP: 'call' } });
  assert.equal(over.logs.stdout.join(''), 'call');
  const back = await run('import os\nprint(os.environ["CG_E2B_KEEP"], end="")');
  assert.equal(back.logs.stdout.join(''), 'mine');
});

test('runCode: a language without a kernelspec is a 400; python by name is the default', { timeout: 30_000 }, async () => {
  // The SDK leaves its request timer running when the request fails (it kept this file's process
  // alive for its whole 60 s default): a short one here.
  await assert.rejects(sbx.runCode('1', { language: 'cobol', timeoutMs: 5_000, requestTimeoutMs: 5_000 }),
    e => e instanceof SandboxError && /^400\b/.test(e.message), 'language cobol was accepted');
  const res = await fetch(`${E2B_URL}/execute`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ code: '1', language: 'cobol' }),
  });
  assert.equal(res.status, 400);
  assert.match(res.headers.get('content-type'), /^text\/plain/);
  assert.match(await res.text(), /cobol.*languages: .*python/);
  // python by name is the default context.
  assert.equal((await run('x', { language: 'python' })).text, '41');
});

// ---- contexts -------------------------------------------------------------------------------

test('contexts: create, separate namespace, list, restart, remove', { timeout: 240_000 }, async () => {
  const ctx = await withTimeout(sbx.createCodeContext(), 90_000, 'createCodeContext');
  try {
    assert.equal(typeof ctx.id, 'string');
    assert.ok(ctx.id.length > 0);
    assert.equal(ctx.language, 'python');
    assert.equal(ctx.cwd, '/home/user', 'E2B\'s default cwd');
    assert.equal((await run('import os\nos.getcwd()', { context: ctx })).text, ctx.cwd);

    await run('only_in_ctx = 7', { context: ctx });
    assert.equal((await run('only_in_ctx * 6', { context: ctx })).text, '42');
    const elsewhere = await run('only_in_ctx', {}, { allowError: true });
    assert.equal(elsewhere.error?.name, 'NameError', describe(elsewhere));
    // The default context's x is not in the new one either.
    const noX = await run('x', { context: ctx }, { allowError: true });
    assert.equal(noX.error?.name, 'NameError', describe(noX));

    const listed = await sbx.listCodeContexts();
    assert.ok(Array.isArray(listed), JSON.stringify(listed));
    const mine = listed.find(c => c.id === ctx.id);
    assert.deepEqual(mine, { id: ctx.id, language: 'python', cwd: ctx.cwd }, JSON.stringify(listed));

    await withTimeout(sbx.restartCodeContext(ctx), 90_000, 'restartCodeContext');
    const gone = await run('only_in_ctx', { context: ctx }, { allowError: true });
    assert.equal(gone.error?.name, 'NameError', describe(gone));
    assert.equal((await run('1 + 1', { context: ctx })).text, '2');
    // The default context did not restart with it.
    assert.equal((await run('x')).text, '41');
  } finally {
    await sbx.removeCodeContext(ctx.id).catch(() => {});
  }
  const after = await sbx.listCodeContexts();
  assert.ok(!after.some(c => c.id === ctx.id), `still listed: ${JSON.stringify(after)}`);
  await assert.rejects(sbx.runCode('1', { context: ctx, requestTimeoutMs: 5_000 }), NotFoundError, 'runCode in a removed context');
  await assert.rejects(sbx.restartCodeContext(ctx), NotFoundError, 'restart of a removed context');
  await assert.rejects(sbx.removeCodeContext(ctx), NotFoundError, 'second remove');
});

test('contexts: cwd is honoured', { timeout: 120_000 }, async () => {
  const ctx = await withTimeout(sbx.createCodeContext({ cwd: '/tmp', language: 'python' }), 90_000,
    'createCodeContext');
  try {
    assert.equal(ctx.cwd, '/tmp');
    assert.equal((await run('import os\nos.getcwd()', { context: ctx })).text, '/tmp');
  } finally {
    await sbx.removeCodeContext(ctx).catch(() => {});
  }
  await assert.rejects(sbx.createCodeContext({ language: 'javascript' }),
    e => e instanceof SandboxError && /^400\b/.test(e.message));
});

// ---- the wire, without the SDK --------------------------------------------------------------

test('wire: /health, NDJSON lines, and the token forms', { timeout: 60_000 }, async () => {
  const health = await fetch(`${E2B_URL}/health`);
  assert.equal(health.status, 200);

  const withHeader = await rawExecute({ code: 'print("raw")\n6 * 7' }, { 'X-Access-Token': gw.token });
  assert.equal(withHeader.status, 200, withHeader.text);
  const types = withHeader.lines.map(l => l.type).filter(t => t !== 'keepalive');
  assert.deepEqual([...types].sort(), ['end_of_execution', 'number_of_executions', 'result', 'stdout'],
    withHeader.text.slice(0, 2000));
  assert.equal(types.at(-1), 'end_of_execution');
  assert.ok(types.indexOf('stdout') < types.indexOf('result'), 'stdout after the result');
  assert.deepEqual(withHeader.lines.find(l => l.type === 'stdout'), { type: 'stdout', text: 'raw\n' });
  const result = withHeader.lines.find(l => l.type === 'result');
  assert.equal(result.text, '42');
  assert.equal(result.is_main_result, true);
  assert.ok(/^[\x00-\x7f]*$/.test(withHeader.text), 'non-ASCII bytes in the NDJSON stream');

  const withAuthorization = await rawExecute({ code: '1' }, { Authorization: `token ${gw.token}` });
  assert.equal(withAuthorization.status, 200, withAuthorization.text);

  // --e2b-no-token lets a request without a token in, not one with a wrong token.
  const wrong = await rawExecute({ code: '1' }, { 'X-Access-Token': 'not-the-token' });
  assert.ok(wrong.status === 401 || wrong.status === 403, `wrong token: ${wrong.status} ${wrong.text}`);

  const bad = await rawExecute({ code: 1 });
  assert.equal(bad.status, 400, bad.text);
  const missing = await rawExecute({ code: '1', context_id: 'no-such-context' });
  assert.equal(missing.status, 404, missing.text);
});

// ---- charts, data and images (the kernel's display formatters) ------------------------------

/** The one result of a cell that displays one figure, with its png and chart. */
async function chartOf(code) {
  const execution = await run(`import matplotlib.pyplot as plt\n${code}\nplt.show()`, { timeoutMs: 120_000 });
  assert.equal(execution.results.length, 1, describe(execution));
  const [result] = execution.results;
  assert.ok(result.png, `no png: ${describe(execution)}`);
  assert.ok(result.chart, `no chart: ${describe(execution)}`);
  return result;
}

test('charts: a line chart with dates, units, scales, ticks and points', { timeout: 150_000 }, async () => {
  const result = await chartOf([
    'import datetime',
    'days = [datetime.datetime(2024, 3, d) for d in range(1, 6)]',
    'plt.figure()',
    "plt.plot(days, [3, 1, 4, 1, 5], label='rain')",
    "plt.plot(days, [2, 7, 1, 8, 2], label='sun')",
    "plt.title('Weather'); plt.xlabel('Day'); plt.ylabel('Amount (mm)')",
  ].join('\n'));
  const { chart } = result;
  assert.equal(result.isMainResult, false);
  assert.deepEqual(result.extra, {}, 'the chart is not an unknown MIME type to the SDK');
  assert.ok(result.text.startsWith('<Figure'), result.text);
  assert.equal(chart.type, 'line');
  assert.equal(chart.title, 'Weather');
  assert.equal(chart.x_label, 'Day');
  assert.equal(chart.y_label, 'Amount (mm)');
  assert.equal(chart.x_unit, null);
  assert.equal(chart.y_unit, 'mm');
  assert.equal(chart.x_scale, 'datetime');
  assert.equal(chart.y_scale, 'linear');
  assert.ok(chart.x_ticks.length > 0 && chart.x_ticks.every(t => typeof t === 'string' && !isNaN(new Date(t))), JSON.stringify(chart.x_ticks));
  assert.ok(chart.y_ticks.length > 0 && chart.y_ticks.every(t => typeof t === 'number'), JSON.stringify(chart.y_ticks));
  assert.equal(chart.x_tick_labels.length, chart.x_ticks.length);
  assert.ok(chart.y_tick_labels.every(t => typeof t === 'string'));
  assert.deepEqual(chart.elements.map(e => e.label), ['rain', 'sun']);
  const rain = chart.elements[0].points;
  assert.equal(rain.length, 5);
  assert.equal(new Date(rain[0][0]).toISOString(), '2024-03-01T00:00:00.000Z');
  assert.equal(new Date(rain[4][0]).toISOString(), '2024-03-05T00:00:00.000Z');
  assert.deepEqual(rain.map(p => p[1]), [3, 1, 4, 1, 5]);
  assert.deepEqual(chart.elements[1].points.map(p => p[1]), [2, 7, 1, 8, 2]);
});

test('charts: bar, pie, box-and-whisker, scatter, log, categorical, superchart, unknown', { timeout: 240_000 }, async () => {
  const bar = (await chartOf([
    'fig, ax = plt.subplots()',
    "ax.bar(['mon', 'tue', 'wed'], [5, 8, 2.5], label='visits')",
    "ax.set_title('Visits'); ax.set_xlabel('Day'); ax.set_ylabel('Count')",
  ].join('\n'))).chart;
  assert.equal(bar.type, 'bar');
  assert.equal(bar.title, 'Visits');
  assert.equal(bar.x_label, 'Day');
  assert.equal(bar.y_unit, null);
  assert.deepEqual(bar.elements, [
    { label: 'mon', value: 5, group: 'visits' },
    { label: 'tue', value: 8, group: 'visits' },
    { label: 'wed', value: 2.5, group: 'visits' },
  ]);

  const pie = (await chartOf([
    'fig, ax = plt.subplots()',
    "ax.pie([1, 3], labels=['cats', 'dogs'], startangle=90, autopct='%1.0f%%')",
    "ax.set_title('Pets')",
  ].join('\n'))).chart;
  assert.equal(pie.type, 'pie');
  assert.equal(pie.title, 'Pets');
  assert.deepEqual(pie.elements, [
    { label: 'cats', angle: 90, radius: 1 },
    { label: 'dogs', angle: 270, radius: 1 },
  ]);

  const box = (await chartOf([
    'fig, ax = plt.subplots()',
    "ax.boxplot([[1, 2, 3, 4, 5, 6, 7, 8, 9, 100], [10, 20, 30]], labels=['g1', 'g2'])",
    "ax.set_ylabel('Latency (ms)')",
  ].join('\n'))).chart;
  assert.equal(box.type, 'box_and_whisker');
  assert.equal(box.y_unit, 'ms');
  assert.deepEqual(box.elements, [
    { label: 'g1', min: 1, first_quartile: 3.25, median: 5.5, third_quartile: 7.75, max: 9, outliers: [100] },
    { label: 'g2', min: 10, first_quartile: 15, median: 20, third_quartile: 25, max: 30, outliers: [] },
  ]);

  const scatter = (await chartOf([
    'plt.figure()',
    "plt.scatter([1, 2, 3], [4, 5, 6], label='a')",
    "plt.scatter([7], [8], label='b')",
  ].join('\n'))).chart;
  assert.equal(scatter.type, 'scatter');
  assert.equal(scatter.title, null);
  assert.deepEqual(scatter.elements, [
    { label: 'a', points: [[1, 4], [2, 5], [3, 6]] },
    { label: 'b', points: [[7, 8]] },
  ]);

  const log = (await chartOf("plt.figure()\nplt.semilogy([1, 2, 3], [10, 1000, 100000])")).chart;
  assert.equal(log.type, 'line');
  assert.equal(log.x_scale, 'linear');
  assert.equal(log.y_scale, 'log');
  assert.deepEqual(log.elements[0].points, [[1, 10], [2, 1000], [3, 100000]]);
  assert.equal(log.elements[0].label, null, 'matplotlib\'s hidden label');

  const categorical = (await chartOf("plt.figure()\nplt.plot(['a', 'b', 'c'], [1, 4, 9])")).chart;
  assert.equal(categorical.x_scale, 'categorical');
  assert.deepEqual(categorical.x_ticks, ['a', 'b', 'c']);
  assert.deepEqual(categorical.elements[0].points, [['a', 1], ['b', 4], ['c', 9]]);

  const superchart = (await chartOf([
    'fig, (left, right) = plt.subplots(1, 2)',
    "fig.suptitle('Two views')",
    "left.plot([0, 1], [1, 0]); left.set_title('line')",
    "right.bar(['x', 'y'], [1, 2]); right.set_title('bars')",
  ].join('\n'))).chart;
  assert.equal(superchart.type, 'superchart');
  assert.equal(superchart.title, 'Two views');
  assert.deepEqual(superchart.elements.map(c => [c.type, c.title]), [['line', 'line'], ['bar', 'bars']]);

  const unknown = (await chartOf([
    'fig, ax = plt.subplots()',
    'ax.add_patch(plt.Circle((0, 0), 1))',
    "ax.set_title('A circle')",
  ].join('\n'))).chart;
  assert.deepEqual(unknown, { type: 'unknown', title: 'A circle', elements: [] });
});

test('data: a DataFrame result carries its columns', { timeout: 120_000 }, async () => {
  const execution = await run(
    "import pandas as pd\npd.DataFrame({'n': [1, 2, 3], 's': ['x', 'y', None], 'f': [0.5, float('nan'), 2]})",
    { timeoutMs: 120_000 });
  const [result] = execution.results;
  assert.equal(result.isMainResult, true);
  assert.deepEqual(result.data, { n: [1, 2, 3], s: ['x', 'y', null], f: [0.5, null, 2] });
  assert.ok(result.html.includes('<table'), 'the HTML is still there');
  assert.ok(result.formats().includes('data'), String(result.formats()));
  // A plain value has none.
  assert.equal((await run('[1, 2]')).results[0].data, undefined);
});

test('images: PIL show() and save() display a png; an Image value is one', { timeout: 120_000 }, async () => {
  const setup = 'from PIL import Image\nimg = Image.new("RGBA", (8, 8), (255, 0, 0, 255))';
  const shown = await run(`${setup}\nimg.show()\nprint("done")`);
  assert.equal(shown.results.length, 1, describe(shown));
  assert.equal(shown.results[0].isMainResult, false);
  assert.deepEqual([...Buffer.from(shown.results[0].png, 'base64').subarray(0, 8)], PNG_SIGNATURE);
  assert.equal(shown.logs.stdout.join(''), 'done\n');

  const value = await run('img');
  assert.ok(value.results[0].png && value.results[0].isMainResult, describe(value));

  // As on E2B: saving to a file shows the image too (E2B contexts only; docs/e2b.md).
  const saved = await run('img.save("red.png")\nimport os\nprint(os.path.getsize("red.png") > 0)');
  assert.equal(saved.results.length, 1, describe(saved));
  assert.ok(saved.results[0].png, describe(saved));
  assert.equal(saved.logs.stdout.join(''), 'True\n');
});

// ---- contexts: order, cwd, languages -------------------------------------------------------

test('contexts: listed in creation order', { timeout: 240_000 }, async () => {
  const made = [];
  try {
    for (let i = 0; i < 4; i++) {
      made.push(await withTimeout(sbx.createCodeContext(), 90_000, 'createCodeContext'));
      const listed = await sbx.listCodeContexts();
      assert.equal(listed.at(-1).id, made.at(-1).id, 'the newest context is listed last');
    }
    const ids = (await sbx.listCodeContexts()).map(c => c.id).filter(id => made.some(m => m.id === id));
    assert.deepEqual(ids, made.map(m => m.id));
  } finally {
    for (const ctx of made) {
      await sbx.removeCodeContext(ctx).catch(() => {});
    }
  }
});

test('contexts: a missing cwd is made; /home/user and /root are the work dir', { timeout: 240_000 }, async () => {
  const made = [];
  try {
    const root = await withTimeout(sbx.createCodeContext({ cwd: '/root' }), 90_000, 'createCodeContext');
    made.push(root);
    assert.equal((await run('import os\nos.getcwd()', { context: root })).text, '/root');

    const deep = await withTimeout(sbx.createCodeContext({ cwd: '/home/user/project/data' }), 90_000, 'createCodeContext');
    made.push(deep);
    const where = await run(
      'import os\nopen("notes.txt", "w").write("hi")\n' +
      'print(os.getcwd(), os.path.exists("/home/kernel/project/data/notes.txt"))',
      { context: deep });
    assert.equal(where.logs.stdout.join(''), '/home/user/project/data True\n');

    // The default context starts in E2B's /home/user.
    assert.equal((await run('from pathlib import Path\nprint(Path.cwd())')).logs.stdout.join(''), '/home/user\n');

    // Outside what a kernel may write (the jail's root is read-only): a 400 naming the cwd.
    await assert.rejects(sbx.createCodeContext({ cwd: '/srv/not-in-the-jail' }),
      e => e instanceof SandboxError && /^400\b/.test(e.message));
  } finally {
    for (const ctx of made) {
      await sbx.removeCodeContext(ctx).catch(() => {});
    }
  }
});

// The kernelspec of language R: Debian's r-cran-irkernel installs `ir` (the jail's side of R
// kernels is tests/conformance's business; this checks that the E2B layer picks it).
const R_KERNELSPEC = '/usr/share/jupyter/kernels/ir/kernel.json';
const hasR = await access(R_KERNELSPEC).then(() => true, () => false);

test('languages: language "r" runs in the R kernelspec, in /home/user', { timeout: 120_000, skip: !hasR && `no ${R_KERNELSPEC}` }, async () => {
  const execution = await run('x <- 6 * 7\nx\ngetwd()', { language: 'r', timeoutMs: 90_000 });
  assert.deepEqual(execution.results.map(r => r.text), ['[1] 42', '[1] "/home/user"'], describe(execution));
  const ctx = await withTimeout(sbx.createCodeContext({ language: 'R', cwd: '/tmp/r-work' }), 90_000, 'createCodeContext');
  try {
    assert.equal(ctx.language, 'r');
    assert.equal((await run('getwd()', { context: ctx })).results[0].text, '[1] "/tmp/r-work"');
    // Its own namespace: x is the default R context's.
    const missing = await run('x', { context: ctx }, { allowError: true });
    assert.ok(missing.error, describe(missing));
    assert.equal((await run('x', { language: 'r' })).results[0].text, '[1] 42');
  } finally {
    await sbx.removeCodeContext(ctx).catch(() => {});
  }
});
