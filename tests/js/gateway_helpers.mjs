// Helpers of the node tests that start gateways of their own (e2b_sandboxes, e2b_tenant_limits):
// a free loopback port, an API key made by `cellgate keys create`, and polling for an event
// against a deadline (never a guessed sleep).
//   const key = await makeKey(CELLGATE, stateDir, 'alice');
//   await waitFor(() => isReady(), 'the sandbox is ready', 60_000, logTail);
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import net from 'node:net';
import { promisify } from 'node:util';

export async function freePort() {
  const server = net.createServer();
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise(resolve => server.close(resolve));
  return port;
}

// A new key of `tenant` in `stateDir`: the last line `cellgate keys create` prints.
export async function makeKey(cellgate, stateDir, tenant) {
  const { stdout } = await promisify(execFile)(cellgate, ['keys', 'create', tenant, '--state-dir', stateDir]);
  const key = stdout.trim().split('\n').at(-1);
  assert.match(key, /^e2b_[0-9a-f]{40}$/, stdout);
  return key;
}

// Polls `probe` until it answers something truthy (a throw counts as not yet), every `everyMs`,
// for at most `ms`; then throws with the last answer and `tail()` (the gateway's log).
export async function waitFor(probe, what, ms = 60_000, tail = () => '', everyMs = 200) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await probe();
      if (last) {
        return last;
      }
    } catch (e) {
      last = e;
    }
    await new Promise(resolve => setTimeout(resolve, everyMs));
  }
  throw new Error(`${what}: not within ${ms} ms (last: ${last})\n${tail()}`);
}
