# The zygote's Python (kernel-launcher/src/zygote_server.cpp runs it once, in a module of its own
# named _cellgate_zygote, kept out of the kernel's __main__). Embedded in cellgate-zygote at build
# time (kernel-launcher/CMakeLists.txt); tests/launcher/test_zygote_python.py runs it against
# Debian's ipykernel.
#
# The embedder sets two globals before it runs:
#   _cellgate_preload  the modules to import (--preload), a list of str
#   _cellgate_home     the HOME every jailed kernel has (jail::kJailWorkDir)
# and afterwards calls, from C++:
#   start_kernel(args, env)    in the forked kernel: runs IPKernelApp on `args`; never returns
#                              unless the app ends (SystemExit carries the exit code)
#   prepare_kernel_app(args)   in the zygote, after each fork: parses the next kernel's argv
#
# The zygote and every kernel share these pages; nothing here may start a thread or a ZeroMQ
# context before the fork (checked at the end of the preload).
import gc, importlib, os, sys, threading

# Modules compute paths from $HOME when they are imported (parso's and jedi's caches, which tab
# completion writes; matplotlib's user font dirs): import them with the home every jailed kernel
# has, or a forked kernel inherits root's (/root/.cache/parso: read-only in the jail, and every
# completion that parses a module answers nothing). start_kernel refreshes the two caches for a
# kernel whose HOME is another one.
os.environ["HOME"] = _cellgate_home
# matplotlib caches its config dir at import; /tmp is the zygote's private tmpfs here and the
# kernel's own tmpfs later. The font list is built now, once, in memory.
os.environ["MPLCONFIGDIR"] = "/tmp/matplotlib"
os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's warning about frozen modules
for _name in _cellgate_preload:
    importlib.import_module(_name)
if "matplotlib" in sys.modules:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    from matplotlib import font_manager
    font_manager.fontManager.ttflist
    try:
        import matplotlib_inline.backend_inline
    except ImportError:
        pass


def _build_shell():
    """The kernel's InteractiveShell, built here once instead of in every kernel (~15 ms and some
    hundreds of copied pages each). Its history is in memory (no thread, no file) and its IPython
    dir in the zygote's /tmp; a kernel adopts it in CellgateKernelApp.init_kernel and gives it what
    depends on the kernel itself: its kernel, profile, history, home and environment."""
    from IPython.core.history import HistoryManager
    from IPython.core.interactiveshell import InteractiveShell
    from ipykernel.compiler import XCachingCompiler
    from ipykernel.zmqshell import ZMQInteractiveShell

    def history_in_memory(self):
        self.history_manager = HistoryManager(shell=self, parent=self, hist_file=":memory:")
        self.configurables.append(self.history_manager)

    init_history = InteractiveShell.init_history
    InteractiveShell.init_history = history_in_memory
    try:
        return ZMQInteractiveShell.instance(ipython_dir="/tmp/ipython",
                                            compiler_class=XCachingCompiler)
    finally:
        InteractiveShell.init_history = init_history


def _adopt_shell(shell, app):
    """What IPythonKernel would have passed the shell, and what the shell computed from the
    zygote's state rather than the kernel's, as a shell built in the kernel has them."""
    from IPython.utils.path import get_home_dir
    from pickleshare import PickleShareDB
    shell.kernel = app.kernel
    shell.parent = app.kernel
    shell.profile_dir = app.profile_dir
    shell.ipython_dir = app.ipython_dir
    shell.home_dir = get_home_dir()
    shell.starting_dir = os.getcwd()
    shell.init_environment()
    shell.db = PickleShareDB(os.path.join(app.profile_dir.location, "db"))
    shell.configurables.remove(shell.history_manager)
    shell.init_history()  # the profile's history.sqlite and its saving thread, as usual
    history = shell.history_manager
    names = {"_ih": history.input_hist_parsed, "_oh": history.output_hist,
             "_dh": history.dir_hist, "In": history.input_hist_parsed,
             "Out": history.output_hist}
    shell.user_ns_hidden.update(names)
    shell.user_ns.update(names)


def _skip_empty_flushes():
    """ipykernel 6's OutStream.flush() hands a flush and then an event to its IO thread and waits
    for the event, even when nothing was written: a trivial cell flushes five times, ~1.5 of its
    ~4 ms round trip here. An empty flush returns at once now: when the buffer is empty and no
    flush is running in the IO thread (which swaps the buffer out first), everything written
    before has been sent. A flush with output waits as before; only the ordering of a reply on
    shell after the iopub messages scheduled before it is no longer forced, which the protocol
    never promised (clients wait for the idle status, which still comes after them)."""
    from ipykernel.iostream import OutStream
    if not all(hasattr(OutStream, a) for a in ("flush", "_flush", "_is_master_process")):
        return
    flush, io_flush = OutStream.flush, OutStream._flush
    OutStream._cellgate_flushing = 0

    def quick_flush(self):
        if (getattr(self, "echo", True) is None and not self._cellgate_flushing
                and getattr(self, "_buffer", None) is not None and self._buffer.tell() == 0
                and self._is_master_process()):
            return
        return flush(self)

    def counted_flush(self):  # runs in the IO thread
        self._cellgate_flushing += 1
        try:
            return io_flush(self)
        finally:
            self._cellgate_flushing -= 1

    OutStream.flush, OutStream._flush = quick_flush, counted_flush


def _coalesce_iopub_wakes():
    """ipykernel 6's IOPubThread.schedule() sends a wake-up over a ZeroMQ pipe for every iopub
    message; the IO thread runs every queued event on each wake-up anyway. A wake-up is sent now
    only when none is pending: the IO thread clears the mark before it counts the queue, so an
    event queued after the count sees the mark cleared and sends its own."""
    from ipykernel.iostream import IOPubThread
    if not all(hasattr(IOPubThread, a) for a in ("schedule", "_handle_event", "_event_pipe")):
        return
    handle_event = IOPubThread._handle_event
    IOPubThread._cellgate_wake_pending = False

    def schedule(self, f):
        if self.thread.is_alive():
            self._events.append(f)
            if not self._cellgate_wake_pending:
                self._cellgate_wake_pending = True  # before the send: the IO thread may run first
                try:
                    self._event_pipe.send(b"")
                except BaseException:
                    self._cellgate_wake_pending = False
                    raise
        else:
            f()

    def counted_handle_event(self, msg):
        self._cellgate_wake_pending = False
        return handle_event(self, msg)

    IOPubThread.schedule, IOPubThread._handle_event = schedule, counted_handle_event


_shell = None
CellgateKernelApp = None  # defined below when the preload has ipykernel
_parsed_argv = None  # the command line the prepared CellgateKernelApp instance has parsed

if "ipykernel" in sys.modules:
    import ipykernel.kernelapp, ipykernel.ipkernel, ipykernel.zmqshell
    # What IPKernelApp.initialize() would still import in every kernel.
    import faulthandler, IPython.core.completerlib, pickleshare

    class CellgateKernelApp(ipykernel.kernelapp.IPKernelApp):
        """IPKernelApp with two steps already done in the zygote: the command line parsed (by
        prepare_kernel_app, for the next kernel) and the shell built (by _build_shell)."""

        def parse_command_line(self, argv=None):
            if _parsed_argv is None or list(argv or []) != _parsed_argv:
                super().parse_command_line(argv)

        def init_kernel(self):
            global _shell
            shell, _shell = _shell, None
            if shell is not None and set(self.config) - {"IPKernelApp", type(self).__name__}:
                # Configured beyond the app's own options (a profile's config file): the shell
                # is built here, from that configuration.
                type(shell).clear_instance()
                shell = None
            super().init_kernel()
            if shell is not None and self.kernel.shell is shell:
                _adopt_shell(shell, self)
            history = getattr(self.kernel.shell, "history_manager", None)
            if history is not None and "db_cache_size" not in self.config.get("HistoryManager", {}):
                # IPython writes each cell's input to history.sqlite as it runs, in a thread that
                # holds the lock the next cell's store_inputs waits for: ~0.7 ms of every round
                # trip. Written every 16 cells instead, at exit, and before any history_request
                # that reads the file (get_tail, search); a killed kernel's file misses <= 15.
                history.db_cache_size = 16
            configured = any("_execute_sleep" in self.config.get(c, {}) for c in ("Kernel", "IPythonKernel"))
            if not configured and hasattr(self.kernel, "_execute_sleep"):
                # ipykernel 6 sleeps 0.5 ms before each execute_reply so that the output flushed
                # just before reaches clients first. Flushing waits for the IO thread to send it,
                # and clients wait for the idle status (sent after it) anyway.
                self.kernel._execute_sleep = 0

    _skip_empty_flushes()
    _coalesce_iopub_wakes()
    _shell = _build_shell()
os.environ.clear()

if threading.active_count() != 1:
    raise RuntimeError("the preload started threads: %r" % threading.enumerate())
if "zmq" in sys.modules and sys.modules["zmq"].Context._instance is not None:
    raise RuntimeError("the preload created a ZeroMQ context")
sys.stdout.flush()
sys.stderr.flush()
_cellgate_preloaded = frozenset(sys.modules)
gc.collect()
gc.freeze()


def _refresh_home_caches():
    """What the preload computed from HOME, again for this kernel's HOME (see the top)."""
    parso_cache = sys.modules.get("parso.cache")
    if parso_cache is not None and hasattr(parso_cache, "_get_default_cache_path"):
        parso_cache._default_cache_path = parso_cache._get_default_cache_path()
    jedi_settings = sys.modules.get("jedi.settings")
    if jedi_settings is not None:
        jedi_settings.cache_directory = os.path.expanduser(
            os.path.join(os.getenv("XDG_CACHE_HOME") or "~/.cache", "jedi"))


def start_kernel(args, env):
    import os, random, sys
    os.environ.clear()
    os.environ.update(env)
    if os.environ.get("HOME") != _cellgate_home or "XDG_CACHE_HOME" in os.environ:
        _refresh_home_caches()
    # A forked interpreter carries the zygote's generator states: reseed every one we know of.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
    # As `python -m ipykernel_launcher` would: the work dir first on sys.path, argv set.
    sys.path.insert(0, os.getcwd())
    sys.argv = ["ipykernel_launcher"] + list(args)
    if CellgateKernelApp is None:
        from ipykernel.kernelapp import IPKernelApp as app_class
    else:
        app_class = CellgateKernelApp
    app = app_class.instance()
    app.initialize(_kernel_argv(args))
    app.start()


def _kernel_argv(args):
    return list(args) + (["--matplotlib=inline"] if "matplotlib.pyplot" in sys.modules else [])


def prepare_kernel_app(args):
    """Run by the zygote after each fork: the next kernel with the same arguments finds its
    command line parsed (~8 ms and ~1,000 copied pages less)."""
    global _parsed_argv
    argv = _kernel_argv(args)
    if argv == _parsed_argv or CellgateKernelApp is None:
        return
    _parsed_argv = None
    CellgateKernelApp.clear_instance()
    CellgateKernelApp.instance().parse_command_line(argv)
    _parsed_argv = argv
