// The zygote: see cellgate/launcher/zygote.hpp for the protocol and the order of things.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/jail/userns.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/launcher/zygote.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/unique_fd.hpp"
#include "cellgate_zygote_py.hpp"
#include "init.hpp"
#include "report.hpp"
#include "zygote_wire.hpp"

extern char** environ;

namespace cellgate::launcher {
namespace {

using nlohmann::json;

// What serve() and the jails it clones share: the zygote's own descriptors, which no jail keeps,
// and those Python holds.
struct Zygote {
  int listen_fd = -1;
  int signal_fd = -1;
  int reaper_fd = -1;  // cellgate-reaper, opened before the zygote jailed itself
  // Descriptors the preload opened and Python objects still hold (IPython keeps /dev/null open).
  // A kernel gets /dev/null in their place rather than a closed number a later open() would
  // reuse under the old object.
  std::vector<int> python_fds;
};

// The kernel's descriptors: 0-2, `keep`, and /dev/null on every number Python holds; no other.
Result<void> settle_kernel_fds(int keep, const std::vector<int>& python_fds) {
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) {
    return errno_error(ErrorCode::kInternal, "fds", "open('/dev/null')", errno);
  }
  for (int fd : python_fds) {
    if (fd != null_fd && ::dup3(null_fd, fd, O_CLOEXEC) < 0) {
      return errno_error(ErrorCode::kInternal, "fds", "dup3(/dev/null)", errno);
    }
  }
  for (int fd : sys::open_fds()) {
    const bool held = std::find(python_fds.begin(), python_fds.end(), fd) != python_fds.end();
    if (fd > 2 && fd != keep && !held) {
      ::close(fd);
    }
  }
  return {};
}

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
  cargv.reserve(argv.size() + 1);
  for (const auto& a : argv) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  char* empty[] = {nullptr};
  ::execve("/proc/self/exe", cargv.data(), empty);
  log_line("re-exec with an empty environment failed: " + sys::error_text(errno));
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
  if (::mount("cellgate-zygote-tmp", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=64m") !=
      0) {
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
    return make_error(
        ErrorCode::kInternal, "python",
        std::string("Py_InitializeFromConfig: ") + (status.err_msg ? status.err_msg : "failed"));
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
  // Compiled under its file's name, so a traceback in the zygote's log points into it.
  const std::string source(kCellgateZygotePy);
  PyObject* code = Py_CompileString(source.c_str(), "cellgate_zygote.py", Py_file_input);
  PyObject* result = code ? PyEval_EvalCode(code, dict, dict) : nullptr;
  Py_XDECREF(code);
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
    return make_error(ErrorCode::kInvalidArgument, "request",
                      std::string("bad request: ") + e.what());
  }
  if ((r.uid == 0 || r.gid == 0) && !jail::in_single_uid_user_namespace()) {
    return make_error(ErrorCode::kInvalidArgument, "request",
                      "a kernel never runs as uid or gid 0");
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

// The kernel: the last jail steps, then Python. Never returns.
[[noreturn]] void run_kernel(const Request& r, const Zygote& z, int err_fd) {
  PyOS_AfterFork_Child();
  sigset_t none;
  sigemptyset(&none);
  auto steps = jail::contain_kernel(r.spec, r.uid, r.gid,
                                    [&] { return settle_kernel_fds(err_fd, z.python_fds); });
  if (!steps) {
    init::fail(err_fd, steps.error().message);
  }
  for (int sig : init::kForwardedSignals) {
    if (sig != SIGINT) {  // Python's own SIGINT handler stays: it raises KeyboardInterrupt
      (void)::signal(sig, SIG_DFL);
    }
  }
  (void)::signal(SIGCHLD, SIG_DFL);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
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

// pid 1 of the new jail (init.hpp). Never returns: it execs the reaper or dies reporting why.
[[noreturn]] void run_init(Request& r, const Zygote& z) {
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
    init::fail(report_fd, "setns(host mount namespace): " + sys::error_text(errno));
  }
  r.fds[0].reset();
  if (::unshare(CLONE_NEWNS) != 0) {
    init::fail(report_fd, "unshare(CLONE_NEWNS): " + sys::error_text(errno));
  }
  auto root = jail::contain_init(r.spec, r.paths, r.uid, r.gid);
  if (!root) {
    init::fail(report_fd, root.error().message);
  }
  if (::dup2(r.fds[3].get(), STDOUT_FILENO) < 0 || ::dup2(r.fds[4].get(), STDERR_FILENO) < 0) {
    init::fail(report_fd, "dup2(stdout/stderr): " + sys::error_text(errno));
  }
  r.fds[3].reset();
  r.fds[4].reset();
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0) {
    init::fail(report_fd, "open('/dev/null'): " + sys::error_text(errno));
  }
  ::close(null_fd);
  PyOS_BeforeFork();
  const pid_t kernel =
      init::start_kernel(report_fd, [&](int setup_fd) { run_kernel(r, z, setup_fd); });
  // The reaper takes fds 3 (report) and 4 (go pipe: EOF when the launcher is gone) and nothing
  // else; the forwarded signals and SIGCHLD stay blocked across exec, so none is lost.
  const int high[3] = {::fcntl(report_fd, F_DUPFD_CLOEXEC, 10), ::fcntl(go_fd, F_DUPFD_CLOEXEC, 10),
                       ::fcntl(z.reaper_fd, F_DUPFD_CLOEXEC, 10)};
  for (int i = 0; i < 3; ++i) {
    if (high[i] < 0 || ::dup2(high[i], 3 + i) < 0) {  // dup2 clears close-on-exec
      const std::string message = "dup2() for the reaper: " + sys::error_text(errno);
      ::kill(kernel, SIGKILL);
      init::fail(report_fd, message);
    }
  }
  ::syscall(SYS_close_range, 6u, ~0u, 0u);
  const std::string kernel_pid = std::to_string(kernel);
  char arg0[] = "cellgate-reaper";
  char* argv[] = {arg0, const_cast<char*>(kernel_pid.c_str()), nullptr};
  char* envp[] = {nullptr};
  ::syscall(SYS_execveat, 5, "", argv, envp, AT_EMPTY_PATH);
  const std::string message = "execveat(cellgate-reaper): " + sys::error_text(errno);
  ::kill(kernel, SIGKILL);
  init::fail(3, message);
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
void serve(int conn, const Zygote& z) {
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
    ::close(z.listen_fd);
    ::close(z.signal_fd);
    run_init(r, z);
  }
  PyOS_AfterFork_Parent();
  if (pid < 0) {
    answer_error("clone(CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): " +
                 sys::error_text(errno));
    return;
  }
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
  if (!pidfd) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    answer_error("pidfd_open(): " + sys::error_text(errno));
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
    write_all(
        options.status_fd,
        json{{"event", "exited"}, {"reason", "setup_error"}, {"message", message}}.dump() + "\n");
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
  const sigset_t mask = init::reaper_signals();
  ::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  ::prctl(PR_SET_DUMPABLE, 0);

  auto listener = listen_on(options.socket_path);
  if (!listener) {
    return fail(listener.error().message);
  }
  char self[PATH_MAX];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    return fail("readlink('/proc/self/exe'): " + sys::error_text(errno));
  }
  self[len] = '\0';
  std::string reaper_path = self;
  reaper_path = reaper_path.substr(0, reaper_path.rfind('/')) + "/cellgate-reaper";
  UniqueFd reaper(::open(reaper_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!reaper) {
    return fail("open('" + reaper_path + "'): " + sys::error_text(errno) +
                " (the static reaper is built beside cellgate-kernel)");
  }
  if (auto jailed = jail_self(); !jailed) {
    return fail(jailed.error().message);
  }
  Zygote zygote;
  zygote.reaper_fd = reaper.get();
  const std::vector<int> before = sys::open_fds();
  if (auto py = start_python(options.preload); !py) {
    return fail(py.error().message);
  }
  for (int fd : sys::open_fds()) {
    if (std::find(before.begin(), before.end(), fd) == before.end()) {
      zygote.python_fds.push_back(fd);
    }
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  UniqueFd signal_fd(::signalfd(-1, &mask, SFD_CLOEXEC));
  if (!signal_fd) {
    return fail("signalfd(): " + sys::error_text(errno));
  }
  zygote.listen_fd = listener->get();
  zygote.signal_fd = signal_fd.get();
  log_line("ready in " + std::to_string(ms) + " ms, serving " + options.socket_path);
  write_all(options.status_fd,
            json{{"event", "ready"}, {"pid", ::getpid()}, {"preload_ms", ms}}.dump() + "\n");

  for (;;) {
    pollfd fds[2] = {{listener->get(), POLLIN, 0}, {signal_fd.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      return fail("poll(): " + sys::error_text(errno));
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
        serve(conn.get(), zygote);
      }
    }
  }
}

}  // namespace cellgate::launcher
