// A notebook page built from JupyterLab 4's own npm packages, as JupyterLab's examples/notebook
// builds one, with JupyterLab's debugger beside it: @jupyterlab/notebook's NotebookPanel on a
// document context, @jupyterlab/debugger's Service, Handler (the toolbar's bug button, the
// editors' breakpoint gutters) and Sidebar (variables, call stack, breakpoints), all talking to
// cellgate through @jupyterlab/services 7. Bundled by esbuild (jupyterlab_debugger.test.mjs);
// the page reads window.CELLGATE = {baseUrl, token, kernel}.
//
// cellgate serves no /api/contents: the document lives in an in-memory drive, so the context
// saves there and starts its session (POST /api/sessions) on cellgate.
import '@jupyterlab/theme-light-extension/style/theme.css';
import '@jupyterlab/theme-light-extension/style/variables.css';
import '@jupyterlab/notebook/style/index.css';
import '@jupyterlab/debugger/style/index.css';

import { Signal } from '@lumino/signaling';
import { CommandRegistry } from '@lumino/commands';
import { SplitPanel, Widget } from '@lumino/widgets';
import {
  ContentsManager,
  KernelManager,
  KernelSpecManager,
  ServerConnection,
  SessionManager,
} from '@jupyterlab/services';
import { Context } from '@jupyterlab/docregistry';
import {
  CodeMirrorEditorFactory,
  CodeMirrorMimeTypeService,
  EditorExtensionRegistry,
  EditorLanguageRegistry,
  ybinding,
} from '@jupyterlab/codemirror';
import { RenderMimeRegistry, standardRendererFactories } from '@jupyterlab/rendermime';
import {
  Notebook,
  NotebookActions,
  NotebookModelFactory,
  NotebookPanel,
  StaticNotebook,
} from '@jupyterlab/notebook';
import { Debugger } from '@jupyterlab/debugger';

const { baseUrl, token, kernel } = window.CELLGATE;
// Where the set-up is, for a test that times out waiting for it.
const step = name => { document.body.dataset.step = name; };

/** Contents.IDrive in memory: the notebook's only store. */
class MemoryDrive {
  constructor(serverSettings) {
    this.name = 'memory';
    this.serverSettings = serverSettings;
    this.fileChanged = new Signal(this);
    this.isDisposed = false;
    this.files = new Map();
  }
  dispose() { this.isDisposed = true; }
  model(path, content) {
    const now = new Date().toISOString();
    return { name: path.split('/').pop(), path, type: 'notebook', format: 'json', content,
             created: now, last_modified: now, mimetype: 'application/x-ipynb+json',
             writable: true, size: JSON.stringify(content ?? null).length };
  }
  async get(path, options) {
    // A new document is checked for before its first save: an empty one, not an error.
    return this.model(path, options?.content === false ? null : this.files.get(path) ?? null);
  }
  async save(path, options) {
    this.files.set(path, options.content);
    const model = this.model(path, null);
    this.fileChanged.emit({ type: 'save', oldValue: null, newValue: model });
    return model;
  }
  async getDownloadUrl(path) { return path; }
  async newUntitled() { throw new Error('not supported'); }
  async delete(path) { this.files.delete(path); }
  async rename() { throw new Error('not supported'); }
  async copy() { throw new Error('not supported'); }
  async createCheckpoint() { return { id: 'c', last_modified: new Date().toISOString() }; }
  async listCheckpoints() { return []; }
  async restoreCheckpoint() {}
  async deleteCheckpoint() {}
}

function editorServices() {
  const languages = new EditorLanguageRegistry();
  for (const language of EditorLanguageRegistry.getDefaultLanguages()) {
    languages.addLanguage(language);
  }
  const extensions = new EditorExtensionRegistry();
  for (const extension of EditorExtensionRegistry.getDefaultExtensions()) {
    extensions.addExtension(extension);
  }
  extensions.addExtension({
    name: 'shared-model-binding',
    factory: ({ model }) => EditorExtensionRegistry.createImmutableExtension(
      ybinding({ ytext: model.sharedModel.ysource, undoManager: model.sharedModel.undoManager ?? undefined })),
  });
  const factoryService = new CodeMirrorEditorFactory({ extensions, languages });
  return { factoryService, mimeTypeService: new CodeMirrorMimeTypeService(languages) };
}

async function main() {
  const serverSettings = ServerConnection.makeSettings({ baseUrl, token, appendToken: true });
  const kernels = new KernelManager({ serverSettings });
  const manager = {
    serverSettings,
    ready: Promise.resolve(),
    isReady: true,
    contents: new ContentsManager({ serverSettings, defaultDrive: new MemoryDrive(serverSettings) }),
    kernels,
    kernelspecs: new KernelSpecManager({ serverSettings }),
    sessions: new SessionManager({ serverSettings, kernelManager: kernels }),
  };
  await manager.kernelspecs.ready;

  const services = editorServices();
  const editorFactory = services.factoryService.newInlineEditor;
  const context = new Context({
    manager,
    factory: new NotebookModelFactory({}),
    path: 'debug.ipynb',
    kernelPreference: { name: kernel, shouldStart: true, canStart: true, autoStartDefault: false },
  });
  const content = new Notebook({
    rendermime: new RenderMimeRegistry({ initialFactories: standardRendererFactories }),
    contentFactory: new NotebookPanel.ContentFactory({ editorFactory }),
    mimeTypeService: services.mimeTypeService,
    notebookConfig: { ...StaticNotebook.defaultNotebookConfig, windowingMode: 'none' },
  });
  const panel = new NotebookPanel({ context, content });
  panel.id = 'notebook';
  step('context');
  await context.initialize(true);
  step('session');
  await context.sessionContext.ready;
  step('debugger');

  const commands = new CommandRegistry();
  const service = new Debugger.Service({ config: new Debugger.Config(), specsManager: manager.kernelspecs });
  const ids = { continue: 'debugger:continue', terminate: 'debugger:terminate',
                next: 'debugger:next', stepIn: 'debugger:stepIn', stepOut: 'debugger:stepOut',
                evaluate: 'debugger:evaluate', pauseOnExceptions: 'debugger:pause-on-exceptions' };
  commands.addCommand(ids.continue, { label: 'Continue', caption: 'Continue', execute: () => service.continue() });
  commands.addCommand(ids.terminate, { label: 'Terminate', caption: 'Terminate', execute: () => service.restart() });
  commands.addCommand(ids.next, { label: 'Next', caption: 'Next', execute: () => service.next() });
  commands.addCommand(ids.stepIn, { label: 'Step In', caption: 'Step In', execute: () => service.stepIn() });
  commands.addCommand(ids.stepOut, { label: 'Step Out', caption: 'Step Out', execute: () => service.stepOut() });
  commands.addCommand(ids.evaluate, { label: 'Evaluate', execute: () => {} });
  commands.addCommand(ids.pauseOnExceptions, { label: 'Pause on exceptions', execute: () => {} });
  const sidebar = new Debugger.Sidebar({
    service,
    callstackCommands: { registry: commands, ...ids },
    breakpointsCommands: { registry: commands, pauseOnExceptions: ids.pauseOnExceptions },
    editorServices: services,
  });
  sidebar.id = 'debugger-sidebar';

  const main = new SplitPanel({ orientation: 'horizontal', spacing: 0 });
  main.id = 'main';
  main.addWidget(panel);
  main.addWidget(sidebar);
  SplitPanel.setStretch(panel, 2);
  SplitPanel.setStretch(sidebar, 1);
  const style = document.createElement('style');
  style.textContent = 'body { margin: 0; } #main { position: absolute; inset: 0; }';
  document.head.appendChild(style);
  Widget.attach(main, document.body);
  window.addEventListener('resize', () => main.update());

  // JupyterLab's shell: the notebook is the current widget, so its bug button acts.
  const handler = new Debugger.Handler({ type: 'notebook', shell: { currentWidget: panel }, service });
  step('handler');
  await handler.updateContext(panel, context.sessionContext);

  // For the test: run the active cell as Shift+Enter would.
  window.cellgateRun = () => NotebookActions.run(content, context.sessionContext);
  document.body.dataset.ready = 'true';
}

main().catch(e => {
  document.body.dataset.error = String(e && e.stack ? e.stack : e);
  console.error(e);
});
