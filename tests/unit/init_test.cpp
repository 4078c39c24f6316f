// pid 1's protocol (kernel-launcher/src/init.hpp) without a jail: the report pipe's lines, and
// start_kernel + reap_kernel run in a forked child of the test playing init, with /bin/sh as
// the kernel. No root, no namespaces.
#include "init.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

namespace cellgate::launcher::init {
namespace {

struct PipeEnds {
  UniqueFd read;
  UniqueFd write;
};
PipeEnds make_pipe() {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

InitReport report_of(const std::string& text) {
  auto p = make_pipe();
  EXPECT_EQ(::write(p.write.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return InitReport(std::move(p.read));  // p.write closes here: the reader sees EOF after text
}

TEST(InitLine, ParsesEachKind) {
  EXPECT_EQ(parse_line("R").kind, InitLine::Kind::kReady);
  const InitLine error = parse_line("Echroot('/x'): EPERM");
  EXPECT_EQ(error.kind, InitLine::Kind::kError);
  EXPECT_EQ(error.text, "chroot('/x'): EPERM");
  const InitLine exit = parse_line("X256");
  EXPECT_EQ(exit.kind, InitLine::Kind::kExit);
  EXPECT_EQ(exit.wait_status, 256);
  for (const char* bad : {"", "X", "X12a", "RR", "Q1"}) {
    EXPECT_EQ(parse_line(bad).kind, InitLine::Kind::kUnknown) << bad;
  }
}

TEST(InitReport, ReadyThenTheKernelsStatus) {
  auto report = report_of("R\nX9\n");
  EXPECT_TRUE(report.wait_ready("ended"));
  EXPECT_EQ(report.kernel_status(), 9);
}

TEST(InitReport, AnErrorLineIsTheFailure) {
  auto report = report_of("Esetns(): EINVAL\n");
  auto ready = report.wait_ready("ended");
  ASSERT_FALSE(ready);
  EXPECT_EQ(ready.error().message, "setns(): EINVAL");
}

TEST(InitReport, EndBeforeReadyIsTheCallersMessage) {
  auto report = report_of("");
  auto ready = report.wait_ready("init ended first");
  ASSERT_FALSE(ready);
  EXPECT_EQ(ready.error().message, "init ended first");
}

TEST(InitReport, NoExitLineIsNoStatus) {
  auto report = report_of("R\n");
  ASSERT_TRUE(report.wait_ready("ended"));
  EXPECT_EQ(report.kernel_status(), std::nullopt);
}

// Forks a child playing init: it starts `script` under /bin/sh as the kernel (its stdin
// `stdin_fd` when given) and reaps it, watching `go` when given. Returns init's pid; its report
// pipe's read end goes to `report`.
pid_t start_init(const char* script, UniqueFd* report, PipeEnds* go = nullptr, int stdin_fd = -1) {
  auto p = make_pipe();
  const sigset_t mask = reaper_signals();
  sigset_t original;
  ::sigprocmask(SIG_BLOCK, &mask, &original);  // as the launcher blocks them before the clone
  const pid_t pid = ::fork();
  if (pid == 0) {
    p.read.reset();
    if (go != nullptr) {
      go->write.reset();  // the launcher's end
    }
    const pid_t kernel = start_kernel(p.write.get(), [&](int setup_fd) {
      if (script[0] == '!') {
        fail(setup_fd, script + 1);
      }
      ::sigprocmask(SIG_SETMASK, &original, nullptr);
      if (stdin_fd >= 0) {
        ::dup2(stdin_fd, STDIN_FILENO);
      }
      ::execl("/bin/sh", "sh", "-c", script, static_cast<char*>(nullptr));
      fail(setup_fd, "execl(/bin/sh)");
    });
    ::_exit(reap_kernel(kernel, p.write.get(), go != nullptr ? go->read.get() : -1));
  }
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  *report = std::move(p.read);
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Init, ReportsReadyThenTheKernelsExit) {
  UniqueFd fd;
  const pid_t init = start_init("exit 3", &fd);
  InitReport report(std::move(fd));
  ASSERT_TRUE(report.wait_ready("ended"));
  EXPECT_EQ(wait_exit_code(init), 0);
  const auto status = report.kernel_status();
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
}

TEST(Init, PassesOnTheKernelsSetupFailure) {
  UniqueFd fd;
  const pid_t init = start_init("!no_new_privs: EPERM", &fd);
  InitReport report(std::move(fd));
  auto ready = report.wait_ready("ended");
  ASSERT_FALSE(ready);
  EXPECT_EQ(ready.error().message, "no_new_privs: EPERM");
  EXPECT_EQ(wait_exit_code(init), 127);
}

TEST(Init, ForwardsSignalsToTheKernel) {
  UniqueFd fd;
  const pid_t init = start_init("exec sleep 60", &fd);
  InitReport report(std::move(fd));
  ASSERT_TRUE(report.wait_ready("ended"));
  ASSERT_EQ(::kill(init, SIGTERM), 0);  // pending until the reaper's signalfd reads it
  EXPECT_EQ(wait_exit_code(init), 0);
  const auto status = report.kernel_status();
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGTERM);
}

TEST(Init, EndsWhenTheGoPipeCloses) {
  auto go = make_pipe();
  auto kernel_stdin = make_pipe();
  UniqueFd fd;
  const pid_t init = start_init("read line", &fd, &go, kernel_stdin.read.get());
  go.read.reset();
  kernel_stdin.read.reset();
  InitReport report(std::move(fd));
  ASSERT_TRUE(report.wait_ready("ended"));
  go.write.reset();  // the launcher is gone
  EXPECT_EQ(wait_exit_code(init), 137);
  EXPECT_EQ(report.kernel_status(), std::nullopt);
  // Without a pid namespace the kernel outlived init here: its stdin's EOF ends it.
  kernel_stdin.write.reset();
}

}  // namespace
}  // namespace cellgate::launcher::init
