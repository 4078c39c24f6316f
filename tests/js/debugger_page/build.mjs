// Bundles page.mjs (JupyterLab 4's notebook and debugger, from npm) with esbuild into
// `outdir`/page.js and page.css, once: a stamp of the page's source and the lockfile lets a
// second run in the same build dir reuse the bundle.
import { createHash } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import esbuild from 'esbuild';

const HERE = path.dirname(fileURLToPath(import.meta.url));

// JupyterLab's stylesheets @import each other webpack-style: '~@jupyterlab/x/style/index.css'.
const tildeImports = {
  name: 'tilde-imports',
  setup(build) {
    build.onResolve({ filter: /^~/ }, args =>
      build.resolve(args.path.slice(1), { kind: args.kind, resolveDir: args.resolveDir }));
  },
};

export async function buildPage(outdir) {
  const hash = createHash('sha256');
  for (const file of [path.join(HERE, 'page.mjs'), path.join(HERE, 'build.mjs'),
                      path.join(HERE, '..', 'package-lock.json')]) {
    hash.update(await readFile(file));
  }
  const stamp = hash.digest('hex');
  const stampFile = path.join(outdir, 'stamp');
  const old = await readFile(stampFile, 'utf8').catch(() => '');
  if (old === stamp) {
    return { outdir, cached: true };
  }
  await mkdir(outdir, { recursive: true });
  await esbuild.build({
    entryPoints: [path.join(HERE, 'page.mjs')],
    bundle: true,
    format: 'iife',
    outfile: path.join(outdir, 'page.js'),
    minify: true,
    logLevel: 'error',
    define: { 'process.env.NODE_ENV': '"production"' },
    loader: { '.svg': 'text', '.woff': 'dataurl', '.woff2': 'dataurl', '.ttf': 'dataurl',
              '.eot': 'dataurl', '.png': 'dataurl', '.gif': 'dataurl' },
    plugins: [tildeImports],
  });
  await writeFile(stampFile, stamp);
  return { outdir, cached: false };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const started = Date.now();
  const r = await buildPage(process.argv[2] || path.join(HERE, '..', '..', '..', 'build', 'js-debugger-page'));
  console.log(`${r.cached ? 'cached' : 'built'} ${r.outdir} in ${Date.now() - started} ms`);
}
