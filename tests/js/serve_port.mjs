// A `cellgate serve` child's port, read from its "listening on" line: shared by the node tests
// that start their own gateway. Sets gw.exited; collects stdout and stderr into gw.log.
//   gw.proc = spawn(BIN, ['serve', '--port', '0', …], { stdio: ['ignore', 'pipe', 'pipe'] });
//   gw.port = await servePort(gw, logTail);   // rejects if it exits first or within 30 s
export function servePort(gw, logTail) {
  gw.exited = new Promise(resolve => gw.proc.once('exit', (code, signal) => resolve({ code, signal })));
  gw.proc.stderr.on('data', d => gw.log.push(d.toString()));
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no "listening on" line within 30 s:\n${logTail()}`)), 30_000);
    gw.exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`cellgate serve exited (${code ?? signal}) before listening:\n${logTail()}`));
    });
    gw.proc.stdout.on('data', d => {
      out += d.toString();
      gw.log.push(d.toString());
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)\//.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
  });
}
