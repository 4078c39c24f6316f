// Tests of the seccomp table: its rows are well formed, and cellgate_seccomp_probe, run under the
// filter, gets exactly the errno the table gives for each call it attempts (derived from the
// table and the raw arguments the probe prints, first matching row wins), while fork, threads,
// AF_UNIX sockets and the personality query keep working.
#include "cellgate/jail/seccomp.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "placement.hpp"

namespace cellgate::jail {
namespace {

const std::string kProbe = cellgate::jail::testing::bin_dir() + "/cellgate_seccomp_probe";
constexpr int kApplyFailedExit = 120;
constexpr int kExecFailedExit = 121;
constexpr auto kProbeDeadline = std::chrono::seconds(60);

// Rows no probe can exercise safely. Empty: every row has one (see the probe's comments for why
// each attempt is harmless without the filter, even as root).
constexpr std::array<std::string_view, 0> kUnprobedRows = {};

// Probes whose result without the filter already equals the row's errno, so they cannot show
// that the row works; each needs a reason.
constexpr std::pair<std::string_view, std::string_view> kNonDiscriminatingProbes[] = {
    {"socketpair:AF_NETLINK", "netlink has no socketpair; the kernel itself says EOPNOTSUPP"},
};

// Syscalls the brief requires the table to deny.
constexpr std::string_view kRequiredDenials[] = {"ptrace",
                                                 "process_vm_readv",
                                                 "process_vm_writev",
                                                 "mount",
                                                 "umount2",
                                                 "pivot_root",
                                                 "chroot",
                                                 "fsopen",
                                                 "fsconfig",
                                                 "fsmount",
                                                 "fspick",
                                                 "open_tree",
                                                 "move_mount",
                                                 "mount_setattr",
                                                 "unshare",
                                                 "setns",
                                                 "clone",
                                                 "clone3",
                                                 "bpf",
                                                 "perf_event_open",
                                                 "keyctl",
                                                 "add_key",
                                                 "request_key",
                                                 "kexec_load",
                                                 "kexec_file_load",
                                                 "init_module",
                                                 "finit_module",
                                                 "delete_module",
                                                 "reboot",
                                                 "swapon",
                                                 "swapoff",
                                                 "userfaultfd",
                                                 "io_uring_setup",
                                                 "io_uring_enter",
                                                 "io_uring_register",
                                                 "ioctl",
                                                 "personality",
                                                 "open_by_handle_at",
                                                 "name_to_handle_at",
                                                 "acct",
                                                 "quotactl",
                                                 "syslog",
                                                 "vhangup",
                                                 "fanotify_init",
                                                 "kcmp",
                                                 "pidfd_getfd",
                                                 "lookup_dcookie",
                                                 "settimeofday",
                                                 "clock_settime",
                                                 "clock_adjtime",
                                                 "adjtimex",
                                                 "iopl",
                                                 "ioperm",
                                                 "socket",
                                                 "socketpair"};

std::string errno_name(int err) {
  const char* name = err > 0 ? strerrorname_np(err) : nullptr;
  return name != nullptr ? name : std::to_string(err);
}

template <typename Container>
bool contains(const Container& names, std::string_view name) {
  for (const auto& entry : names) {
    if constexpr (std::is_convertible_v<decltype(entry), std::string_view>) {
      if (entry == name) {
        return true;
      }
    } else if (entry.first == name) {
      return true;
    }
  }
  return false;
}

struct ProbeRun {
  std::string out;
  std::string err;
  int status = 0;
  bool timed_out = false;
};

void drain(int fd, std::string& into, bool& open) {
  char buf[4096];
  const ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0) {
    into.append(buf, static_cast<std::size_t>(n));
  } else if (n == 0 || errno != EINTR) {
    open = false;
  }
}

// Forks; the child sets no_new_privs, applies `table` (none if null) and execs the probe with
// `mode`. Returns its stdout, stderr and wait status.
ProbeRun run_probe(const std::vector<SeccompRow>* table, const char* mode = nullptr) {
  ProbeRun run;
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << errno_name(errno);
    return run;
  }
  // Built before fork: the child only calls apply_seccomp and async-signal-safe functions.
  std::vector<char*> argv = {const_cast<char*>(kProbe.c_str())};
  if (mode != nullptr) {
    argv.push_back(const_cast<char*>(mode));
  }
  argv.push_back(nullptr);
  // LeakSanitizer stops the world with ptrace, which the filter denies.
  std::vector<std::string> env_strings = {"ASAN_OPTIONS=detect_leaks=0"};
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr) {
    env_strings.push_back(std::string("TMPDIR=") + tmp);
  }
  std::vector<char*> env;
  env.reserve(env_strings.size() + 1);
  for (auto& s : env_strings) {
    env.push_back(s.data());
  }
  env.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << errno_name(errno);
    return run;
  }
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the SIGSYS tests kill it on purpose
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      _exit(kApplyFailedExit);
    }
    if (table != nullptr) {
      if (auto r = apply_seccomp(*table); !r) {
        const std::string text = r.error().describe() + "\n";
        [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, text.data(), text.size());
        _exit(kApplyFailedExit);
      }
    }
    execve(kProbe.c_str(), argv.data(), env.data());
    _exit(kExecFailedExit);
  }
  close(out[1]);
  close(err[1]);
  bool out_open = true;
  bool err_open = true;
  const auto deadline = std::chrono::steady_clock::now() + kProbeDeadline;
  while (out_open || err_open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) {
      break;
    }
    if (out_open && fds[0].revents != 0) {
      drain(out[0], run.out, out_open);
    }
    if (err_open && fds[1].revents != 0) {
      drain(err[0], run.err, err_open);
    }
  }
  close(out[0]);
  close(err[0]);
  while (waitpid(pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  return run;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    return "exit " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("signal SIG") + (name != nullptr ? name : std::to_string(WTERMSIG(status)));
  }
  return "status " + std::to_string(status);
}

struct ProbeLine {
  std::string name;
  bool expect_deny = false;
  std::optional<std::string> syscall;
  std::vector<std::uint64_t> args;
  long ret = 0;
  int err = 0;
  int signal = 0;
};

// Parses the probe's lines; fails the test on a malformed one. Stops at "done".
std::vector<ProbeLine> parse_lines(const std::string& out, bool& saw_done) {
  std::vector<ProbeLine> lines;
  std::istringstream in(out);
  std::string text;
  saw_done = false;
  while (std::getline(in, text)) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name")) {
      ADD_FAILURE() << "probe printed a line that is not a probe record: " << text;
      continue;
    }
    if (j.at("name") == "done") {
      saw_done = true;
      EXPECT_EQ(j.value("count", -1), static_cast<int>(lines.size())) << "probe lost lines";
      break;
    }
    ProbeLine line;
    line.name = j.at("name").get<std::string>();
    line.expect_deny = j.value("expect", "") == "deny";
    if (j.contains("syscall")) {
      line.syscall = j.at("syscall").get<std::string>();
      line.args = j.at("args").get<std::vector<std::uint64_t>>();
    }
    line.ret = j.at("ret").get<long>();
    line.err = j.at("errno").get<int>();
    line.signal = j.value("signal", 0);
    lines.push_back(std::move(line));
  }
  return lines;
}

bool row_matches(const SeccompRow& row, const std::vector<std::uint64_t>& args) {
  for (const auto& a : row.args) {
    const std::uint64_t v = a.index < args.size() ? args[a.index] : 0;
    if (((v & a.mask) == a.value) == a.not_equal) {
      return false;
    }
  }
  return true;
}

// The table's answer for a call: the first matching row, or none (allowed).
std::optional<std::size_t> first_match(const std::vector<SeccompRow>& table,
                                       const std::string& syscall,
                                       const std::vector<std::uint64_t>& args) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (table[i].syscall == syscall && row_matches(table[i], args)) {
      return i;
    }
  }
  return std::nullopt;
}

bool filters_available() {
  return describe_seccomp_support().find("filter mode available") != std::string::npos;
}

bool already_filtered() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Seccomp:", 0) == 0) {
      return line.find('0') == std::string::npos;
    }
  }
  return false;
}

TEST(SeccompTable, EveryRowHasAReasonAndANativeSyscall) {
  const auto& table = default_seccomp_table();
  std::set<std::string> names;
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& row = table[i];
    SCOPED_TRACE("row " + std::to_string(i) + " (" + row.syscall + ")");
    names.insert(row.syscall);
    EXPECT_FALSE(row.reason.empty());
    EXPECT_GE(seccomp_syscall_resolve_name(row.syscall.c_str()), 0)
        << "libseccomp does not know it as a native syscall";
    EXPECT_GT(row.errno_value, 0);
    EXPECT_LE(row.errno_value, 4095);
    std::set<unsigned> indices;
    for (const auto& a : row.args) {
      EXPECT_LT(a.index, 6u);
      EXPECT_TRUE(indices.insert(a.index).second) << "two conditions on argument " << a.index;
      EXPECT_NE(a.mask, 0u);
      EXPECT_EQ(a.value & ~a.mask, 0u) << "value outside the mask";
    }
  }
  for (const auto& name : kRequiredDenials) {
    EXPECT_EQ(names.count(std::string(name)), 1u) << "no row for " << name;
  }
}

TEST(SeccompTable, OnlyCloneThreeGetsEnosysAndOnlyNetlinkGetsEopnotsupp) {
  for (const auto& row : default_seccomp_table()) {
    SCOPED_TRACE(row.syscall + ": " + row.reason);
    if (row.syscall == "clone3") {
      EXPECT_EQ(row.errno_value, ENOSYS);
    } else if (row.errno_value == EOPNOTSUPP) {
      ASSERT_EQ(row.args.size(), 1u);
      EXPECT_EQ(row.args[0].value, static_cast<std::uint64_t>(AF_NETLINK));
    } else {
      EXPECT_EQ(row.errno_value, EPERM);
    }
  }
}

// Answers the brief fixes whatever the table's layout: libzmq aborts on EPERM for netlink, glibc
// falls back from clone3 only on ENOSYS, and these calls must keep working.
TEST(SeccompTable, PinnedAnswers) {
  const auto& table = default_seccomp_table();
  const auto answer = [&](const std::string& syscall, const std::vector<std::uint64_t>& args) {
    const auto row = first_match(table, syscall, args);
    return row ? table[*row].errno_value : 0;
  };
  EXPECT_EQ(answer("socket", {AF_NETLINK, SOCK_RAW, 0}), EOPNOTSUPP);
  EXPECT_EQ(answer("socket", {AF_INET, SOCK_STREAM, 0}), EPERM);
  EXPECT_EQ(answer("socket", {AF_UNIX, SOCK_STREAM, 0}), 0);
  EXPECT_EQ(answer("socketpair", {AF_UNIX, SOCK_STREAM, 0}), 0);
  EXPECT_EQ(answer("socketpair", {AF_INET6, SOCK_STREAM, 0}), EPERM);
  EXPECT_EQ(answer("clone3", {0, 64}), ENOSYS);
  EXPECT_EQ(answer("clone", {SIGCHLD}), 0);
  EXPECT_EQ(answer("clone", {0x003d0f00}), 0);  // glibc's pthread_create flags
  for (unsigned bit = 0; bit < 32; ++bit) {
    const std::uint64_t flag = std::uint64_t{1} << bit;
    EXPECT_EQ(answer("clone", {flag | SIGCHLD}), (flag & 0x7E020080u) != 0 ? EPERM : 0) << bit;
  }
  EXPECT_EQ(answer("personality", {0}), 0);
  EXPECT_EQ(answer("personality", {0xFFFFFFFFu}), 0);
  EXPECT_EQ(answer("personality", {0x0040000}), EPERM);
  EXPECT_EQ(answer("ioctl", {0, TIOCSTI | (std::uint64_t{1} << 32)}), EPERM);
  EXPECT_EQ(answer("ioctl", {0, FIONREAD}), 0);
  EXPECT_EQ(answer("mknodat", {0, 0, S_IFIFO | 0600, 0}), 0);
  EXPECT_EQ(answer("mknodat", {0, 0, S_IFCHR | 0600, 0}), EPERM);
}

// Asserts the exact errno of every probe line against the table, and that the controls work.
void expect_every_row(const ProbeRun& run) {
  const auto& table = default_seccomp_table();
  ASSERT_FALSE(run.timed_out) << "probe hung; stderr:\n" << run.err;
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
      << "probe: " << describe_status(run.status) << "; stderr:\n"
      << run.err;
  bool saw_done = false;
  const auto lines = parse_lines(run.out, saw_done);
  EXPECT_TRUE(saw_done) << "probe output ended early:\n" << run.out;

  std::set<std::string> seen;
  std::set<std::size_t> covered;
  for (const auto& line : lines) {
    SCOPED_TRACE("probe " + line.name);
    EXPECT_TRUE(seen.insert(line.name).second) << "duplicate probe name";
    EXPECT_EQ(line.signal, 0) << "the attempt was killed by signal " << line.signal;
    if (!line.syscall) {  // fork, pthread: library-level controls
      EXPECT_FALSE(line.expect_deny);
      EXPECT_EQ(line.err, 0) << errno_name(line.err);
      EXPECT_EQ(line.ret, 0);
      continue;
    }
    const auto row = first_match(table, *line.syscall, line.args);
    if (line.expect_deny) {
      if (!row) {
        ADD_FAILURE() << "no row of the table denies " << *line.syscall << " with these "
                      << "arguments; got " << errno_name(line.err);
        continue;
      }
      covered.insert(*row);
      EXPECT_EQ(line.ret, -1);
      EXPECT_EQ(errno_name(line.err), errno_name(table[*row].errno_value))
          << "row " << *row << ": " << table[*row].reason;
    } else {
      EXPECT_FALSE(row.has_value())
          << "a control call is denied by row " << *row << ": " << table[*row].reason;
      EXPECT_EQ(line.err, 0) << errno_name(line.err);
      EXPECT_GE(line.ret, 0);
    }
  }
  for (const char* control :
       {"fork", "pthread", "clone:plain", "socket:AF_UNIX", "socketpair:AF_UNIX",
        "personality:PER_LINUX", "personality:query", "ioctl:FIONREAD", "mknodat:S_IFIFO"}) {
    EXPECT_EQ(seen.count(control), 1u) << "control " << control << " missing";
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (covered.count(i) == 0 && !contains(kUnprobedRows, table[i].syscall)) {
      ADD_FAILURE() << "row " << i << " (" << table[i].syscall << ": " << table[i].reason
                    << ") decides no probe; add one to cellgate_seccomp_probe";
    }
  }
}

TEST(SeccompProbe, EveryRowGivesItsErrnoAndControlsStillWork) {
  if (!filters_available()) {
    GTEST_SKIP() << "no seccomp filters here: " << describe_seccomp_support();
  }
  const auto& table = default_seccomp_table();
  expect_every_row(run_probe(&table));
}

// The same probe inside the whole jail, through the launcher with the default spec: the filter
// the kernel really gets, after namespaces, mounts, credentials and rlimits.
ProbeRun run_probe_in_jail() {
  ProbeRun run;
  char dir_template[] = "/tmp/cellgate-probe-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << errno_name(errno);
    return run;
  }
  const std::string dir = dir_template;
  const std::string spec_path = dir + "/spec.json";
  {
    std::ofstream spec(spec_path);
    spec << R"({"binds": [{"source": ")" << kProbe << R"(", "target": "/opt/cellgate/probe"}], )"
         << R"("cgroup_parent": ")" << testing::cgroup_parent() << R"("})";
  }
  const std::string out_path = dir + "/out";
  const std::string command = cellgate::jail::testing::bin_dir() + "/cellgate-kernel --spec " +
                              spec_path + " -- /opt/cellgate/probe > " + out_path + " 2>&1";
  run.status = std::system(command.c_str());
  std::ifstream in(out_path);
  run.out.assign(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove_all(dir);
  return run;
}

TEST(SeccompProbe, EveryRowGivesItsErrnoInsideTheJail) {
  if (!filters_available()) {
    GTEST_SKIP() << "no seccomp filters here: " << describe_seccomp_support();
  }
  if (geteuid() != 0) {
    GTEST_SKIP() << "the jail needs root";
  }
  expect_every_row(run_probe_in_jail());
}

// Without the filter (as root, so permission checks pass) each denied probe must get something
// other than the row's errno, or its passing above proves nothing.
TEST(SeccompProbe, ProbesGetAnotherAnswerWithoutTheFilter) {
  if (geteuid() != 0 || cellgate::jail::testing::rootless()) {
    GTEST_SKIP() << "needs real root: unprivileged (or root of a user namespace only), many "
                    "calls fail with EPERM anyway, so the comparison shows nothing";
  }
  if (already_filtered()) {
    GTEST_SKIP() << "this process already runs under a seccomp filter (a container?)";
  }
  const auto& table = default_seccomp_table();
  const ProbeRun run = run_probe(nullptr);
  ASSERT_FALSE(run.timed_out) << "probe hung; stderr:\n" << run.err;
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
      << "probe: " << describe_status(run.status) << "; stderr:\n"
      << run.err;
  bool saw_done = false;
  const auto lines = parse_lines(run.out, saw_done);
  EXPECT_TRUE(saw_done);
  for (const auto& line : lines) {
    SCOPED_TRACE("probe " + line.name);
    EXPECT_EQ(line.signal, 0);
    if (!line.expect_deny || !line.syscall) {
      EXPECT_EQ(line.err, 0) << "control fails even without the filter: " << errno_name(line.err);
      continue;
    }
    const auto row = first_match(table, *line.syscall, line.args);
    ASSERT_TRUE(row.has_value());
    if (!contains(kNonDiscriminatingProbes, line.name)) {
      EXPECT_NE(line.err, table[*row].errno_value)
          << "without the filter this already fails with " << errno_name(line.err);
    }
  }
}

// int $0x80 enters the i386 table: not the filter's architecture, so the process is killed.
TEST(SeccompProbe, I386AbiKillsTheProcess) {
  if (!filters_available()) {
    GTEST_SKIP() << "no seccomp filters here: " << describe_seccomp_support();
  }
  const ProbeRun bare = run_probe(nullptr, "--int80");
  if (!WIFEXITED(bare.status) || WEXITSTATUS(bare.status) != 0) {
    GTEST_SKIP() << "int $0x80 does not work here even without a filter ("
                 << describe_status(bare.status) << "): IA32 emulation is off";
  }
  EXPECT_NE(bare.out.find("\"errno\":0"), std::string::npos) << bare.out;
  const ProbeRun run = run_probe(&default_seccomp_table(), "--int80");
  ASSERT_FALSE(run.timed_out);
  ASSERT_TRUE(WIFSIGNALED(run.status))
      << describe_status(run.status) << "; out: " << run.out << "; err: " << run.err;
  EXPECT_EQ(WTERMSIG(run.status), SIGSYS) << describe_status(run.status);
  EXPECT_EQ(run.out, "");
}

TEST(SeccompProbe, X32AbiKillsTheProcess) {
  if (!filters_available()) {
    GTEST_SKIP() << "no seccomp filters here: " << describe_seccomp_support();
  }
  const ProbeRun bare = run_probe(nullptr, "--x32");
  ASSERT_TRUE(WIFEXITED(bare.status) && WEXITSTATUS(bare.status) == 0)
      << describe_status(bare.status) << "; err: " << bare.err;
  const ProbeRun run = run_probe(&default_seccomp_table(), "--x32");
  ASSERT_FALSE(run.timed_out);
  ASSERT_TRUE(WIFSIGNALED(run.status)) << describe_status(run.status) << "; out: " << run.out;
  EXPECT_EQ(WTERMSIG(run.status), SIGSYS);
}

struct ApplyOutcome {
  bool ok = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  bool getppid_works = false;
  bool exited_cleanly = false;
};

// Applies `table` in a forked child, so that a filter loaded by mistake cannot reach the test
// process, and reports the result and whether getppid (the first row below) still works.
ApplyOutcome apply_in_child(const std::vector<SeccompRow>& table) {
  ApplyOutcome outcome;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << errno_name(errno);
    return outcome;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    auto r = apply_seccomp(table);
    errno = 0;
    const bool getppid_works = syscall(SYS_getppid) > 0;
    std::string text = std::string(r.ok() ? "1" : "0") + (getppid_works ? "1" : "0");
    if (!r.ok()) {
      text += std::to_string(static_cast<int>(r.error().code)) + " " + r.error().describe();
    }
    [[maybe_unused]] const ssize_t n = write(p[1], text.data(), text.size());
    _exit(0);
  }
  close(p[1]);
  std::string text;
  bool open = true;
  while (open) {
    drain(p[0], text, open);
  }
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.exited_cleanly = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (text.size() >= 2) {
    outcome.ok = text[0] == '1';
    outcome.getppid_works = text[1] == '1';
    if (!outcome.ok) {
      const auto space = text.find(' ');
      outcome.code = static_cast<ErrorCode>(std::stoi(text.substr(2, space - 2)));
      outcome.message = text.substr(space + 1);
    }
  }
  return outcome;
}

SeccompRow getppid_row() {
  return SeccompRow{"getppid", EPERM, {}, "test row"};
}

TEST(SeccompApply, UnknownSyscallIsAnErrorAndLoadsNothing) {
  const auto outcome = apply_in_child(
      {getppid_row(), SeccompRow{"no_such_syscall_cellgate", EPERM, {}, "test row"}});
  ASSERT_TRUE(outcome.exited_cleanly);
  EXPECT_FALSE(outcome.ok);
  EXPECT_EQ(outcome.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(outcome.message.find("no_such_syscall_cellgate"), std::string::npos) << outcome.message;
  EXPECT_TRUE(outcome.getppid_works) << "a filter was loaded despite the error";
}

TEST(SeccompApply, MalformedRowsAreErrors) {
  const std::vector<std::pair<std::string, SeccompRow>> cases = {
      {"two conditions on one argument",
       SeccompRow{"personality", EPERM, {{0, ~0ull, 0, true}, {0, ~0ull, 1, true}}, "x"}},
      {"errno 0 would fake success", SeccompRow{"ptrace", 0, {}, "x"}},
      {"argument index 6", SeccompRow{"ptrace", EPERM, {{6, ~0ull, 0, false}}, "x"}},
      {"value outside the mask", SeccompRow{"ptrace", EPERM, {{0, 0xF, 0x10, false}}, "x"}},
      {"no reason", SeccompRow{"ptrace", EPERM, {}, ""}},
      {"not a syscall on x86_64", SeccompRow{"socketcall", EPERM, {}, "x"}},
      {"masked not-equal over too many bits",
       SeccompRow{"ioctl", EPERM, {{1, 0xFFFFFFFFu, 0, true}, {2, 0xFFFFu, 0, true}}, "x"}},
  };
  for (const auto& [what, row] : cases) {
    SCOPED_TRACE(what);
    const auto outcome = apply_in_child({getppid_row(), row});
    ASSERT_TRUE(outcome.exited_cleanly);
    EXPECT_FALSE(outcome.ok);
    EXPECT_EQ(outcome.code, ErrorCode::kInvalidArgument) << outcome.message;
    EXPECT_TRUE(outcome.getppid_works);
  }
}

TEST(SeccompApply, AValidTableLoadsAndDenies) {
  const auto outcome = apply_in_child({getppid_row()});
  ASSERT_TRUE(outcome.exited_cleanly);
  EXPECT_TRUE(outcome.ok) << outcome.message;
  EXPECT_FALSE(outcome.getppid_works);
}

// SECCOMP_FILTER_FLAG_TSYNC: a thread that exists before the filter is loaded is filtered too.
TEST(SeccompApply, FiltersThreadsThatAlreadyExist) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int> stage{0};
    std::atomic<long> result{0};
    std::thread other([&] {
      while (stage.load() != 1) {
      }
      result = syscall(SYS_getppid) > 0 ? 0 : errno;
      stage = 2;
    });
    const bool ok = apply_seccomp({getppid_row()}).ok();
    stage = 1;
    other.join();
    const char text[2] = {ok ? '1' : '0', result.load() == EPERM ? 'P' : 'x'};
    [[maybe_unused]] const ssize_t n = write(p[1], text, sizeof text);
    _exit(0);
  }
  close(p[1]);
  std::string text;
  bool open = true;
  while (open) {
    drain(p[0], text, open);
  }
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << describe_status(status);
  EXPECT_EQ(text, "1P") << "the other thread's getppid was not denied";
}

TEST(SeccompSupport, DescribesLibseccompAndTheKernel) {
  const scmp_version* v = seccomp_version();
  const std::string text = describe_seccomp_support();
  EXPECT_EQ(text.rfind("libseccomp " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                           "." + std::to_string(v->micro),
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("filter mode"), std::string::npos) << text;
}

}  // namespace
}  // namespace cellgate::jail
