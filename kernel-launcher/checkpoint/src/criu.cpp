// Finding, checking and running CRIU: see criu.hpp.
#include "cellgate/checkpoint/criu.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "cellgate/sys/text.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::checkpoint {
namespace {

constexpr std::size_t kMaxOutput = std::size_t{64} * 1024;

// `criu --version` prints "Version: 4.2.1" (and a GitCommitID line for git builds).
std::string criu_version(const std::string& criu) {
  std::string out;
  auto status = run_program(criu, {"--version"}, {}, &out);
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return "";
  }
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Version:", 0) == 0) {
      return std::string(sys::trim(line.substr(8)));
    }
  }
  return "";
}

std::vector<std::string> candidates() {
  std::vector<std::string> found;
  // getenv races only with setenv, which the launcher never calls.
  if (const char* env = std::getenv("CELLGATE_CRIU");  // NOLINT(concurrency-mt-unsafe)
      env != nullptr && *env != '\0') {
    found.emplace_back(env);
    return found;  // the operator's choice, and only it
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): as above
  std::istringstream dirs(path != nullptr ? path : "/usr/sbin:/usr/bin:/sbin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/criu").c_str(), X_OK) == 0) {
      found.push_back(dir + "/criu");
      break;
    }
  }
  found.emplace_back(kPrivateCriu);
  return found;
}

// The last line of criu's output that says what failed ("Error (criu/…): …"), else the last.
std::string last_error_line(const std::string& output) {
  std::istringstream lines(output);
  std::string last;
  std::string error;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("Error") != std::string::npos) {
      error = line;
    }
    if (!sys::trim(line).empty()) {
      last = line;
    }
  }
  return std::string(sys::trim(error.empty() ? last : error));
}

CriuSupport find_recent_criu() {
  CriuSupport s;
  std::string too_old;
  for (const auto& criu : candidates()) {
    if (::access(criu.c_str(), X_OK) != 0) {
      continue;
    }
    const std::string version = criu_version(criu);
    if (version_at_least(version, 4, 2)) {
      s.path = criu;
      s.version = version;
      return s;
    }
    too_old += (too_old.empty() ? "" : ", ") + criu + " is " +
               (version.empty() ? "not a working criu" : "version " + version);
  }
  s.reason = "no CRIU >= 4.2 found" + (too_old.empty() ? "" : " (" + too_old + ")") +
             "; scripts/install-criu builds one into " + kPrivateCriu +
             ", or set CELLGATE_CRIU to one";
  return s;
}

}  // namespace

bool version_at_least(const std::string& version, int major, int minor) {
  int got_major = 0;
  int got_minor = 0;
  char dot = 0;
  std::istringstream in(version);
  if (!(in >> got_major >> dot >> got_minor) || dot != '.') {
    return false;
  }
  return got_major > major || (got_major == major && got_minor >= minor);
}

std::string CriuSupport::describe() const {
  if (available) {
    return "checkpoints: CRIU " + version + " (" + path + ")";
  }
  return "checkpoints unavailable: " + reason;
}

Result<std::string> find_criu() {
  const CriuSupport s = find_recent_criu();
  if (s.path.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "criu_unavailable", s.reason);
  }
  return s.path;
}

CriuSupport probe_criu() {
  CriuSupport s = find_recent_criu();
  if (s.path.empty()) {
    return s;
  }
  if (::geteuid() != 0) {
    s.reason = "CRIU " + s.version +
               " needs root to checkpoint a jail (run the gateway as root, "
               "or with `serve --user`, whose broker is root)";
    return s;
  }
  std::string out;
  auto status = run_program(s.path, {"check"}, {}, &out);
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    s.reason = "`" + s.path +
               " check` failed: " + (status ? last_error_line(out) : status.error().message);
    return s;
  }
  s.available = true;
  return s;
}

Result<int> run_program(const std::string& program, const std::vector<std::string>& args,
                        const std::vector<int>& keep_fds, std::string* output) {
  // Everything the child needs is built before fork: it only calls async-signal-safe functions.
  std::vector<std::string> all = {program};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(all.size() + 1);
  for (auto& a : all) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  char* envp[] = {const_cast<char*>("PATH=/usr/sbin:/usr/bin:/sbin:/bin"), nullptr};
  int pipe_fds[2] = {-1, -1};
  if (output != nullptr && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return errno_error(ErrorCode::kInternal, "criu", "pipe2()", errno);
  }
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  sigset_t none;
  sigemptyset(&none);
  const pid_t pid = ::fork();
  if (pid < 0) {
    return errno_error(ErrorCode::kInternal, "criu", "fork()", errno);
  }
  if (pid == 0) {
    // stdin is /dev/null unless it is to be inherited (--inherit-fd fd[0]:…).
    bool keep_stdin = false;
    for (int fd : keep_fds) {
      keep_stdin = keep_stdin || fd == STDIN_FILENO;
    }
    if (!keep_stdin && dev_null) {
      ::dup2(dev_null.get(), STDIN_FILENO);
    }
    if (write_end) {
      ::dup2(write_end.get(), STDOUT_FILENO);
      ::dup2(write_end.get(), STDERR_FILENO);
    }
    for (int fd : keep_fds) {
      ::fcntl(fd, F_SETFD, 0);
    }
    // The launcher blocks SIGCHLD and the forwarded signals (host_jail.hpp); CRIU needs them.
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp);
    ::_exit(127);
  }
  write_end.reset();
  if (output != nullptr) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(read_end.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        break;
      }
      if (output->size() < kMaxOutput) {
        output->append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return errno_error(ErrorCode::kInternal, "criu", "waitpid()", errno);
    }
  }
  return status;
}

}  // namespace cellgate::checkpoint
