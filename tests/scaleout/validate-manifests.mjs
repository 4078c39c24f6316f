// Validates Kubernetes objects offline with npm's kubernetes-models (its bundled OpenAPI schemas,
// compiled by ajv), then walks each object for keys those schemas do not know.
//
//   node validate-manifests.mjs NODE_MODULES_DIR < objects.json > report.json
//
// stdin: [{"file": ..., "index": ..., "object": {...}}, ...] (the YAML documents, as JSON).
// stdout: one report per object: {file, index, kind, name, errors: [...], unknown: [...]}.
//
// Why the walk: validate() checks every field it knows but accepts any field it does not
// (a typo such as `readinesProbe` passes; the API server would drop it or refuse it). The
// compiled schemas have no list of property names to read, so the walk asks them: a key the
// schema knows is type-checked, so putting `true` (and then a string) in its place makes
// validate() report an error at that key's path; a key the schema does not know is never
// checked, and both probes pass. Maps (labels, ConfigMap data) are typed too: their keys count
// as known. A field typed "anything" would be reported as unknown; none is used here.
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { readFileSync } from "node:fs";

const nodeModules = process.argv[2];
if (!nodeModules) {
  console.error("usage: node validate-manifests.mjs NODE_MODULES_DIR < objects.json");
  process.exit(2);
}

const modules = new Map();
async function modelFor(apiVersion, kind) {
  // "apps/v1" → kubernetes-models/apps/v1; the core group "v1" → kubernetes-models/v1.
  if (!/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion)) return null;
  if (!modules.has(apiVersion)) {
    const file = join(nodeModules, "kubernetes-models", apiVersion, "index.js");
    modules.set(apiVersion, await import(pathToFileURL(file).href).catch(() => null));
  }
  const mod = modules.get(apiVersion);
  return mod && typeof mod[kind] === "function" ? mod[kind] : null;
}

function errorsOf(Model, object) {
  try {
    new Model(structuredClone(object)).validate();
    return [];
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    return e.errors;
  }
}

// JSON Pointer, as ajv writes instancePath: "/" in a key is "~1", "~" is "~0".
const pointer = (key) => "/" + String(key).replace(/~/g, "~0").replace(/\//g, "~1");

function setAt(object, path, value) {
  const copy = structuredClone(object);
  let node = copy;
  for (const key of path.slice(0, -1)) node = node[key];
  node[path[path.length - 1]] = value;
  return copy;
}

function known(Model, object, path, where) {
  for (const probe of [true, "\u0000probe"]) {
    const errors = errorsOf(Model, setAt(object, path, probe));
    if (errors.some((e) => e.instancePath === where || e.instancePath.startsWith(where + "/"))) {
      return true;
    }
  }
  return false;
}

function walk(Model, object, node, path, where, unknown) {
  if (Array.isArray(node)) {
    node.forEach((item, i) => walk(Model, object, item, [...path, i], where + pointer(i),
      unknown));
  } else if (node !== null && typeof node === "object") {
    for (const [key, value] of Object.entries(node)) {
      const keyPath = [...path, key];
      const keyWhere = where + pointer(key);
      if (UNCHECKED.has(`${object.kind} ${keyWhere}`)) continue;
      if (!known(Model, object, keyPath, keyWhere)) {
        unknown.push(keyWhere);
        continue;
      }
      walk(Model, object, value, keyPath, keyWhere, unknown);
    }
  }
}

// Real fields that the compiled schemas do not check at all, so no probe can see them: a
// property named `description` (also a JSON Schema keyword) is dropped from PriorityClass's
// (its type declarations, PriorityClass.d.ts, list it: "description"?: string).
const UNCHECKED = new Set(["PriorityClass /description"]);

const input = JSON.parse(readFileSync(0, "utf8"));
const reports = [];
for (const { file, index, object } of input) {
  const report = {
    file, index, kind: object?.kind, name: object?.metadata?.name, errors: [], unknown: [],
  };
  const Model = await modelFor(String(object?.apiVersion), String(object?.kind));
  if (!Model) {
    report.errors.push(`no kubernetes-models model for ${object?.apiVersion} ${object?.kind}`);
  } else {
    report.errors = errorsOf(Model, object).map((e) => `${e.instancePath} ${e.message}`);
    // The walk needs a valid object: a probe's error must be the probe's alone.
    if (report.errors.length === 0) walk(Model, object, object, [], "", report.unknown);
  }
  reports.push(report);
}
process.stdout.write(JSON.stringify(reports, null, 2) + "\n");
