// JupyterLab 4's debugger in a browser, on a jailed cellgate kernel: a page built from
// JupyterLab's npm packages (debugger_page/page.mjs: @jupyterlab/notebook, @jupyterlab/debugger,
// @jupyterlab/services 7, bundled once by esbuild into the build dir), driven by playwright-core
// in Debian's Chromium (/usr/bin/chromium). As a user would: type a cell, press the notebook's
// bug button, click line 2's breakpoint gutter, run the cell, see the frame's variables in the
// debugger's Variables panel, press Continue, see the cell's output.
//
// The kernel is of a kernelspec with metadata.cellgate.debugger on a gateway started with
// --allow-debugger (a loopback-only network: jail/README.md). Skipped without root (the jail)
// or without Chromium.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

import { buildPage } from './debugger_page/build.mjs';
import { servePort } from './serve_port.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN_DIR = path.resolve(HERE, process.env.CELLGATE_BIN_DIR || '../../build/bin');
const CHROMIUM = process.env.CELLGATE_CHROMIUM || '/usr/bin/chromium';
const KERNEL = 'python3-debugger';
const skip = process.getuid() !== 0 ? 'the jail needs root'
  : !existsSync(CHROMIUM) ? `no Chromium at ${CHROMIUM} (apt-get install chromium)` : false;

const gw = { proc: null, dir: null, port: 0, token: '', log: [] };
const PAGE_DIR = path.join(BIN_DIR, '..', 'js-debugger-page');
let browser = null;
let pages = null;  // the page's own origin: http://127.0.0.1:<port>/, let in by --allow-origin

// Serves the bundle, and index.html pointing it at the gateway, from another loopback origin, as
// a page served elsewhere talks to cellgate (README: --allow-origin).
async function startPageServer() {
  const server = http.createServer(async (req, res) => {
    const name = new URL(req.url, 'http://x').pathname.slice(1) || 'index.html';
    const types = { 'index.html': 'text/html', 'page.js': 'text/javascript', 'page.css': 'text/css' };
    if (!types[name]) {
      res.writeHead(404).end();
      return;
    }
    const body = name === 'index.html'
      ? `<!doctype html><html><head><meta charset="utf-8"><link rel="stylesheet" href="page.css">
<script>window.CELLGATE = ${JSON.stringify({ baseUrl: `http://127.0.0.1:${gw.port}/`, token: gw.token, kernel: KERNEL })};</script>
</head><body><script src="page.js"></script></body></html>`
      : await readFile(path.join(PAGE_DIR, name));
    res.writeHead(200, { 'Content-Type': types[name] }).end(body);
  });
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
  return { server, origin: `http://127.0.0.1:${server.address().port}` };
}

function logTail(n = 40) {
  return gw.log.join('').split('\n').slice(-n).join('\n');
}

async function startGateway() {
  gw.dir = await mkdtemp(path.join(tmpdir(), 'cellgate-debugger-'));
  gw.token = randomBytes(16).toString('hex');
  const specDir = path.join(gw.dir, 'jupyter', 'kernels', KERNEL);
  await mkdir(specDir, { recursive: true });
  await writeFile(path.join(specDir, 'kernel.json'), JSON.stringify({
    argv: ['/usr/bin/python3', '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
    display_name: 'Python 3 (debugger)', language: 'python',
    metadata: { debugger: true, cellgate: { debugger: true } },
  }));
  gw.proc = spawn(
    path.join(BIN_DIR, 'cellgate'),
    ['serve', '--ip', '127.0.0.1', '--port', '0', '--token', gw.token, '--allow-debugger',
     '--allow-origin', pages.origin,
     '--pool-size', '0', '--state-dir', path.join(gw.dir, 'state')],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, JUPYTER_PATH: path.join(gw.dir, 'jupyter') } },
  );
  gw.port = await servePort(gw, logTail);
}

before(async () => {
  if (skip) {
    return;
  }
  pages = await startPageServer();
  // The bundle and the gateway at once: both take seconds.
  await Promise.all([buildPage(PAGE_DIR), startGateway()]);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}, { timeout: 120_000 });

after(async () => {
  await browser?.close().catch(() => {});
  pages?.server.close();
  if (gw.proc && gw.proc.exitCode === null && gw.proc.signalCode === null) {
    gw.proc.kill('SIGTERM');
    const timer = setTimeout(() => gw.proc.kill('SIGKILL'), 30_000);
    await gw.exited;
    clearTimeout(timer);
  }
  if (gw.dir) {
    await rm(gw.dir, { recursive: true, force: true }).catch(() => {});
  }
}, { timeout: 60_000 });

const CELL = 'def f(a, b):\n    c = a + b\n    return c\n\nprint(f(20, 22))';

test('JupyterLab\'s debugger stops at a breakpoint and shows the frame\'s variables', { skip, timeout: 120_000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on('pageerror', e => errors.push(String(e)));
  try {
    await page.goto(`${pages.origin}/index.html`);
    await page.waitForFunction(() => document.body.dataset.ready || document.body.dataset.error,
                               null, { timeout: 90_000 });
    const error = await page.evaluate(() => document.body.dataset.error);
    assert.equal(error, undefined, error);

    // Type the cell as a user would (insertText: CodeMirror's auto-indent stays out of it).
    await page.locator('.jp-Cell .cm-content').first().click();
    await page.keyboard.insertText(CELL);

    // The notebook's bug button, enabled once the debugger service saw the kernelspec's
    // metadata.debugger, starts the debugger (initialize, attach on the control channel).
    const bug = page.locator('jp-button.jp-DebuggerBugButton[aria-disabled="false"]');
    await bug.waitFor({ timeout: 30_000 });
    await bug.click();
    await page.locator('#notebook[data-jp-debugger="true"]').waitFor({ timeout: 30_000 });

    // A breakpoint on line 2: a click in the breakpoint gutter beside it.
    await page.locator('.jp-Cell .cm-breakpoint-gutter').first().waitFor({ timeout: 30_000 });
    const gutter = await page.locator('.jp-Cell .cm-breakpoint-gutter').first().boundingBox();
    const line = await page.locator('.jp-Cell .cm-line').nth(1).boundingBox();
    assert.ok(gutter && line, 'no gutter or line 2 to click');
    await page.mouse.click(gutter.x + gutter.width / 2, line.y + line.height / 2);
    // Its red dot in the gutter (the gutter's spacer holds a hidden one), and the Breakpoints
    // panel's entry, which appears once the kernel answered setBreakpoints.
    await page.locator('.jp-Cell .cm-breakpoint-icon:visible').first().waitFor({ timeout: 30_000 });
    await page.locator('#debugger-sidebar .jp-DebuggerBreakpoint', {
      has: page.locator('.jp-DebuggerBreakpoint-line', { hasText: /^2$/ }),
    }).waitFor({ timeout: 30_000 });

    // Run it: the kernel stops in f, and the Variables panel shows a and b.
    await page.evaluate(() => { void window.cellgateRun(); });
    const variable = name => page.locator('.jp-DebuggerVariables-body .jp-TreeItem', {
      has: page.locator('.jp-DebuggerVariables-name', { hasText: new RegExp(`^${name}$`) }),
    }).first();
    await variable('a').waitFor({ timeout: 60_000 });
    assert.equal((await variable('a').locator('.jp-DebuggerVariables-detail').first().textContent()).trim(), '20');
    assert.equal((await variable('b').locator('.jp-DebuggerVariables-detail').first().textContent()).trim(), '22');

    // Continue: the cell finishes and prints.
    await page.locator('#debugger-sidebar jp-button[title="Continue"]').click();
    await page.locator('.jp-OutputArea-output', { hasText: '42' }).first().waitFor({ timeout: 30_000 });
    assert.deepEqual(errors, []);
  } catch (e) {
    e.message += `\npage errors: ${errors.join('\n')}\ngateway log:\n${logTail()}`;
    throw e;
  } finally {
    await page.close();
  }
});
