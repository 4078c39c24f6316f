// The zygote: see cellgate/launcher/zygote.hpp for the protocol and the order of things.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/userns.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/launcher/zygote.hpp"
#include "cellgate/unique_fd.hpp"
#include "report.hpp"
#include "zygote_wire.hpp"

extern char** environ;

namespace cellgate::launcher {
namespace {

using nlohmann::json;

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Descriptors the preload opened and Python objects still hold (IPython keeps /dev/null open).
// A kernel gets /dev/null in their place rather than a closed number a later open() would reuse
// under the old object.
std::vector<int> g_python_fds;

std::vector<int> open_fds() {
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') {
        const int fd = std::atoi(e->d_name);
        if (fd != own) {
          fds.push_back(fd);
        }
      }
    }
    ::closedir(d);
  }
  return fds;
}

// The kernel's descriptors: 0-2, `keep`, and /dev/null on every number Python holds; no other.
Result<void> settle_kernel_fds(int keep) {
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) {
    return errno_error(ErrorCode::kInternal, "fds", "open('/dev/null')", errno);
  }
  for (int fd : g_python_fds) {
    if (fd != null_fd && ::dup3(null_fd, fd, O_CLOEXEC) < 0) {
      return errno_error(ErrorCode::kInternal, "fds", "dup3(/dev/null)", errno);
    }
  }
  for (int fd : open_fds()) {
    const bool held = std::find(g_python_fds.begin(), g_python_fds.end(), fd) != g_python_fds.end();
    if (fd > 2 && fd != keep && !held) {
      ::close(fd);
    }
  }
  return {};
}

// The Python side, run once in a module of its own (kept out of the kernel's __main__).
constexpr const char* kPreloadSource = R"PY(
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
)PY";

void log_line(const std::string& text) {
  std::string line = "cellgate-kernel --zygote: " + text + "\n";
  write_all(STDERR_FILENO, line);
}

// An empty environment: re-exec unless environ is already empty. The old block would otherwise
// stay in our memory (and in every kernel's copy of it).
void reexec_with_empty_environment(const std::vector<std::string>& argv) {
  if (environ == nullptr || environ[0] == nullptr) {
    return;
  }
  std::vector<char*> cargv;
  for (const auto& a : argv) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  char* empty[] = {nullptr};
  ::execve("/proc/self/exe", cargv.data(), empty);
  log_line("re-exec with an empty environment failed: " + std::string(std::strerror(errno)));
  ::_exit(127);
}

Result<UniqueFd> listen_on(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return make_error(ErrorCode::kInvalidArgument, "socket",
                      "the socket path must have 1 to " + std::to_string(sizeof addr.sun_path - 1) +
                          " characters");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "socket", "socket(AF_UNIX)", errno);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return make_error(ErrorCode::kFailedPrecondition, "socket",
                        path + " exists and is not a socket");
    }
    ::unlink(path.c_str());  // a previous zygote's
  }
  const mode_t old = ::umask(077);
  const int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) {
    return errno_error(ErrorCode::kInternal, "socket", "bind('" + path + "')", errno);
  }
  if (::listen(fd.get(), 128) != 0) {
    return errno_error(ErrorCode::kInternal, "socket", "listen('" + path + "')", errno);
  }
  return fd;
}

// The zygote's own jail: no network, no shared IPC, the mount tree read-only, /tmp private.
Result<void> jail_self() {
  auto fail = [](const std::string& call) {
    return errno_error(ErrorCode::kFailedPrecondition, "zygote_jail", call, errno);
  };
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) {
    return fail("unshare(CLONE_NEWNS|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS)");
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return fail("mount('/', MS_REC|MS_PRIVATE)");
  }
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
  if (::syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &attr, sizeof attr) != 0) {
    return fail("mount_setattr('/', AT_RECURSIVE, MOUNT_ATTR_RDONLY)");
  }
  if (::mount("cellgate-zygote-tmp", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=0700,size=64m") != 0) {
    return fail("mount(tmpfs, '/tmp')");
  }
  const char name[] = "cellgate-zygote";
  if (::sethostname(name, sizeof name - 1) != 0) {
    return fail("sethostname()");
  }
  if (::chdir("/") != 0) {
    return fail("chdir('/')");
  }
  return {};
}

Result<void> start_python(const std::vector<std::string>& preload) {
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  // The interpreter /usr/bin/python3 would be, so sys.prefix, sys.path and sys.executable match
  // an exec-mode kernel's; no user site-packages (root's would otherwise be on sys.path).
  config.parse_argv = 0;
  config.user_site_directory = 0;
  config.install_signal_handlers = 1;  // SIGINT → KeyboardInterrupt, as ipykernel expects
  auto set = [&](wchar_t** field, const char* value) {
    PyStatus s = PyConfig_SetBytesString(&config, field, value);
    return !PyStatus_Exception(s);
  };
  if (!set(&config.program_name, "/usr/bin/python3") ||
      !set(&config.executable, "/usr/bin/python3")) {
    PyConfig_Clear(&config);
    return make_error(ErrorCode::kInternal, "python", "PyConfig_SetBytesString failed");
  }
  PyStatus status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    return make_error(ErrorCode::kInternal, "python",
                      std::string("Py_InitializeFromConfig: ") +
                          (status.err_msg ? status.err_msg : "failed"));
  }
  PyObject* module = PyImport_AddModule("_cellgate_zygote");  // borrowed
  PyObject* dict = module ? PyModule_GetDict(module) : nullptr;
  PyObject* list = PyList_New(0);
  if (dict == nullptr || list == nullptr) {
    return make_error(ErrorCode::kInternal, "python", "could not create the zygote's module");
  }
  for (const auto& name : preload) {
    PyObject* s = PyUnicode_FromString(name.c_str());
    PyList_Append(list, s);
    Py_DECREF(s);
  }
  PyDict_SetItemString(dict, "_cellgate_preload", list);
  Py_DECREF(list);
  PyObject* home = PyUnicode_FromString(jail::kJailWorkDir);
  if (home == nullptr) {
    return make_error(ErrorCode::kInternal, "python", "could not create the zygote's module");
  }
  PyDict_SetItemString(dict, "_cellgate_home", home);
  Py_DECREF(home);
  PyDict_SetItemString(dict, "__builtins__", PyEval_GetBuiltins());
  PyObject* result = PyRun_String(kPreloadSource, Py_file_input, dict, dict);
  if (result == nullptr) {
    PyErr_Print();
    return make_error(ErrorCode::kFailedPrecondition, "preload",
                      "importing the preload list failed (the traceback is in the zygote's log)");
  }
  Py_DECREF(result);
  return {};
}

struct Request {
  jail::JailSpec spec;
  uid_t uid = 0;
  gid_t gid = 0;
  jail::RootPaths paths;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  // In order: host mount namespace, report pipe, go pipe, stdout, stderr.
  std::vector<UniqueFd> fds;
};
constexpr std::size_t kRequestFds = 5;

Result<Request> parse_request(zygote_wire::Message message) {
  json j = json::parse(message.text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "request", "the request is not a JSON object");
  }
  if (message.fds.size() != kRequestFds) {
    return make_error(ErrorCode::kInvalidArgument, "request",
                      "a request carries " + std::to_string(kRequestFds) + " descriptors, not " +
                          std::to_string(message.fds.size()));
  }
  Request r;
  try {
    CELLGATE_ASSIGN_OR_RETURN(r.spec, spec_from_json(j.at("spec")));
    r.uid = j.at("uid").get<uid_t>();
    r.gid = j.at("gid").get<gid_t>();
    r.paths.staging = j.at("staging").get<std::string>();
    r.paths.conn_dir = j.at("conn_dir").get<std::string>();
    r.paths.work_dir = j.at("work_dir").get<std::string>();
    r.args = j.at("args").get<std::vector<std::string>>();
    for (auto& [k, v] : j.at("env").items()) {
      r.env.emplace_back(k, v.get<std::string>());
    }
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, "request", std::string("bad request: ") + e.what());
  }
  if ((r.uid == 0 || r.gid == 0) && !jail::in_single_uid_user_namespace()) {
    return make_error(ErrorCode::kInvalidArgument, "request", "a kernel never runs as uid or gid 0");
  }
  r.fds = std::move(message.fds);
  return r;
}

// A new reference to a Python list of the strings.
PyObject* py_string_list(const std::vector<std::string>& strings) {
  PyObject* list = PyList_New(0);
  for (const auto& a : strings) {
    PyObject* s = PyUnicode_FromString(a.c_str());
    PyList_Append(list, s);
    Py_DECREF(s);
  }
  return list;
}

[[noreturn]] void die_with(int fd, const std::string& message) {
  write_all(fd, "E" + message + "\n");
  ::_exit(127);
}

// The kernel: the last jail steps, then Python. Never returns.
[[noreturn]] void run_kernel(const Request& r, int err_fd) {
  PyOS_AfterFork_Child();
  sigset_t none;
  sigemptyset(&none);
  auto steps =
      jail::contain_kernel(r.spec, r.uid, r.gid, [&] { return settle_kernel_fds(err_fd); });
  if (!steps) {
    die_with(err_fd, steps.error().message);
  }
  for (int sig : kForwarded) {
    if (sig != SIGINT) {  // Python's own SIGINT handler stays: it raises KeyboardInterrupt
      ::signal(sig, SIG_DFL);
    }
  }
  ::signal(SIGCHLD, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::close(err_fd);  // EOF: the kernel is set up

  PyObject* module = PyImport_AddModule("_cellgate_zygote");
  PyObject* start = module ? PyObject_GetAttrString(module, "start_kernel") : nullptr;
  PyObject* args = py_string_list(r.args);
  PyObject* env = PyDict_New();
  for (const auto& [k, v] : r.env) {
    PyObject* s = PyUnicode_FromString(v.c_str());
    PyDict_SetItemString(env, k.c_str(), s);
    Py_DECREF(s);
  }
  int code = 0;
  PyObject* result = start ? PyObject_CallFunctionObjArgs(start, args, env, nullptr) : nullptr;
  if (result == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyObject* c = value ? PyObject_GetAttrString(value, "code") : nullptr;
      code = (c && PyLong_Check(c)) ? static_cast<int>(PyLong_AsLong(c)) : (c == Py_None ? 0 : 1);
      Py_XDECREF(c);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    } else {
      PyErr_Print();
      code = 1;
    }
  }
  // As the interpreter's exit would: atexit handlers (IPython's history), flushed streams.
  PyRun_SimpleString(
      "import atexit, sys\n"
      "atexit._run_exitfuncs()\n"
      "try:\n    sys.stdout.flush(); sys.stderr.flush()\n"
      "except Exception:\n    pass\n");
  ::_exit(code);
}

// pid 1 of the new jail. Never returns: it execs the reaper or dies reporting why.
[[noreturn]] void run_init(Request& r, int reaper_fd) {
  PyOS_AfterFork_Child();
  const int report_fd = r.fds[1].get();
  const int go_fd = r.fds[2].get();
  ::prctl(PR_SET_DUMPABLE, 0);
  char go = 0;
  while (::read(go_fd, &go, 1) < 0 && errno == EINTR) {
  }
  if (go != 'G') {
    ::_exit(127);  // the launcher gave up (its cgroup attach failed) and reported why
  }
  if (::setns(r.fds[0].get(), CLONE_NEWNS) != 0) {
    die_with(report_fd, "setns(host mount namespace): " + std::string(std::strerror(errno)));
  }
  r.fds[0].reset();
  if (::unshare(CLONE_NEWNS) != 0) {
    die_with(report_fd, "unshare(CLONE_NEWNS): " + std::string(std::strerror(errno)));
  }
  auto root = jail::contain_init(r.spec, r.paths, r.uid, r.gid);
  if (!root) {
    die_with(report_fd, root.error().message);
  }
  if (::dup2(r.fds[3].get(), STDOUT_FILENO) < 0 || ::dup2(r.fds[4].get(), STDERR_FILENO) < 0) {
    die_with(report_fd, "dup2(stdout/stderr): " + std::string(std::strerror(errno)));
  }
  r.fds[3].reset();
  r.fds[4].reset();
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0) {
    die_with(report_fd, "open('/dev/null'): " + std::string(std::strerror(errno)));
  }
  ::close(null_fd);
  int setup[2];
  if (::pipe2(setup, O_CLOEXEC) != 0) {
    die_with(report_fd, "pipe2(): " + std::string(std::strerror(errno)));
  }
  PyOS_BeforeFork();
  pid_t kernel = ::fork();
  if (kernel < 0) {
    die_with(report_fd, "fork(): " + std::string(std::strerror(errno)));
  }
  if (kernel == 0) {
    ::close(setup[0]);
    run_kernel(r, setup[1]);
  }
  ::close(setup[1]);
  const std::string failure = read_until_eof(setup[0]);
  if (!failure.empty()) {
    write_all(report_fd, failure);  // "E<text>\n"
    ::_exit(127);
  }
  write_all(report_fd, "R\n");
  // The reaper takes fds 3 (report) and 4 (go pipe: EOF when the launcher is gone) and nothing
  // else; the forwarded signals and SIGCHLD stay blocked across exec, so none is lost.
  const int high[3] = {::fcntl(report_fd, F_DUPFD_CLOEXEC, 10), ::fcntl(go_fd, F_DUPFD_CLOEXEC, 10),
                       ::fcntl(reaper_fd, F_DUPFD_CLOEXEC, 10)};
  for (int i = 0; i < 3; ++i) {
    if (high[i] < 0 || ::dup2(high[i], 3 + i) < 0) {  // dup2 clears close-on-exec
      write_all(report_fd, "Edup2() for the reaper: " + std::string(std::strerror(errno)) + "\n");
      ::kill(kernel, SIGKILL);
      ::_exit(127);
    }
  }
  ::syscall(SYS_close_range, 6u, ~0u, 0u);
  const std::string kernel_pid = std::to_string(kernel);
  char arg0[] = "cellgate-reaper";
  char* argv[] = {arg0, const_cast<char*>(kernel_pid.c_str()), nullptr};
  char* envp[] = {nullptr};
  ::syscall(SYS_execveat, 5, "", argv, envp, AT_EMPTY_PATH);
  write_all(3, "Eexecveat(cellgate-reaper): " + std::string(std::strerror(errno)) + "\n");
  ::kill(kernel, SIGKILL);
  ::_exit(127);
}

// While the jail just cloned starts: the next kernel's command line parsed in advance (see
// prepare_kernel_app in the preload). A failure is logged; that kernel then parses its own.
void prepare_next_kernel(const std::vector<std::string>& args) {
  PyObject* module = PyImport_AddModule("_cellgate_zygote");  // borrowed
  PyObject* prepare = module ? PyObject_GetAttrString(module, "prepare_kernel_app") : nullptr;
  PyObject* list = py_string_list(args);
  PyObject* result = prepare ? PyObject_CallOneArg(prepare, list) : nullptr;
  if (result == nullptr) {
    log_line("preparing the next kernel's command line failed:");
    PyErr_Print();
  }
  Py_XDECREF(result);
  Py_DECREF(list);
  Py_XDECREF(prepare);
}

// Clones the jail's pid 1 for one request and answers on `conn`.
void serve(int conn, int listen_fd, int signal_fd, int reaper_fd) {
  timeval tv{2, 0};
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto answer_error = [&](const std::string& message) {
    log_line("request refused: " + message);
    (void)zygote_wire::send_message(conn, json{{"error", message}}.dump(), {});
  };
  auto message = zygote_wire::recv_message(conn);
  if (!message) {
    answer_error(message.error().message);
    return;
  }
  auto request = parse_request(std::move(message).value());
  if (!request) {
    answer_error(request.error().message);
    return;
  }
  Request& r = request.value();
  constexpr unsigned long kFlags =
      CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
  PyOS_BeforeFork();
  long pid = ::syscall(SYS_clone, kFlags, nullptr, nullptr, nullptr, nullptr);
  if (pid == 0) {
    ::close(conn);
    ::close(listen_fd);
    ::close(signal_fd);
    run_init(r, reaper_fd);
  }
  PyOS_AfterFork_Parent();
  if (pid < 0) {
    answer_error("clone(CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): " +
                 std::string(std::strerror(errno)));
    return;
  }
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
  if (!pidfd) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    answer_error("pidfd_open(): " + std::string(std::strerror(errno)));
    return;
  }
  auto sent = zygote_wire::send_message(conn, json{{"pid", pid}}.dump(), {pidfd.get()});
  if (!sent) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);  // nobody supervises it: it must not run
    log_line("reply lost: " + sent.error().message);
    return;
  }
  prepare_next_kernel(r.args);
}

}  // namespace

int run_zygote(const ZygoteOptions& options) {
  reexec_with_empty_environment(options.self_argv);
  const auto t0 = std::chrono::steady_clock::now();
  auto fail = [&](const std::string& message) {
    log_line(message);
    write_all(options.status_fd, json{{"event", "exited"}, {"reason", "setup_error"},
                                      {"message", message}}.dump() + "\n");
    return 1;
  };
  if (::geteuid() != 0) {
    return fail("the zygote builds jails and needs root");
  }
  if (options.status_fd >= 0) {
    ::fcntl(options.status_fd, F_SETFD, FD_CLOEXEC);
  }
  // A zygote outliving its gateway would be a root process nobody supervises; its kernels need
  // it only to start.
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) {
    return fail("the parent ended while the zygote started");
  }
  // Blocked for good: SIGCHLD and SIGTERM arrive on the signalfd, the rest stays blocked so a
  // jail's pid 1 inherits them blocked and its reaper receives them.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : kForwarded) {
    sigaddset(&mask, sig);
  }
  sigaddset(&mask, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  ::prctl(PR_SET_DUMPABLE, 0);

  auto listener = listen_on(options.socket_path);
  if (!listener) {
    return fail(listener.error().message);
  }
  char self[PATH_MAX];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    return fail("readlink('/proc/self/exe'): " + std::string(std::strerror(errno)));
  }
  self[len] = '\0';
  std::string reaper_path = self;
  reaper_path = reaper_path.substr(0, reaper_path.rfind('/')) + "/cellgate-reaper";
  UniqueFd reaper(::open(reaper_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!reaper) {
    return fail("open('" + reaper_path + "'): " + std::strerror(errno) +
                " (the static reaper is built beside cellgate-kernel)");
  }
  if (auto jailed = jail_self(); !jailed) {
    return fail(jailed.error().message);
  }
  const std::vector<int> before = open_fds();
  if (auto py = start_python(options.preload); !py) {
    return fail(py.error().message);
  }
  for (int fd : open_fds()) {
    if (std::find(before.begin(), before.end(), fd) == before.end()) {
      g_python_fds.push_back(fd);
    }
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0).count();
  UniqueFd signal_fd(::signalfd(-1, &mask, SFD_CLOEXEC));
  if (!signal_fd) {
    return fail("signalfd(): " + std::string(std::strerror(errno)));
  }
  log_line("ready in " + std::to_string(ms) + " ms, serving " + options.socket_path);
  write_all(options.status_fd,
            json{{"event", "ready"}, {"pid", ::getpid()}, {"preload_ms", ms}}.dump() + "\n");

  for (;;) {
    pollfd fds[2] = {{listener->get(), POLLIN, 0}, {signal_fd.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      return fail("poll(): " + std::string(std::strerror(errno)));
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      if (::read(signal_fd.get(), &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT || info.ssi_signo == SIGHUP) {
          log_line("ending on signal " + std::to_string(info.ssi_signo) +
                   "; the kernels it started run on");
          ::unlink(options.socket_path.c_str());  // may fail: our view is read-only
          return 0;
        }
      }
      while (::waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
    if (fds[0].revents & POLLIN) {
      UniqueFd conn(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn) {
        serve(conn.get(), listener->get(), signal_fd.get(), reaper.get());
      }
    }
  }
}

}  // namespace cellgate::launcher
