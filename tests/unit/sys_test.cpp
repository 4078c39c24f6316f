// The sys floor (jail/sys): pipes, pidfd children, the SOCK_SEQPACKET channel with descriptors and
// its limits, directory streams, file reads and writes, and the /proc readers on our own process.
// No root, no Python.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cellgate/sys/dir_stream.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/pipe.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/sys/process.hpp"
#include "cellgate/sys/seqpacket.hpp"

namespace cellgate::sys {
namespace {

using namespace std::chrono_literals;

bool is_cloexec(int fd) {
  return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
}

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "cellgate-sys-XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Pipe, CarriesBytesAndEndsAtTheWriterClose) {
  auto p = make_pipe();
  ASSERT_TRUE(p) << p.error().describe();
  EXPECT_TRUE(is_cloexec(p->read.get()));
  EXPECT_TRUE(is_cloexec(p->write.get()));
  ASSERT_TRUE(write_all(p->write.get(), "hello", 5));
  p->write.reset();
  char buf[16];
  auto n = read_some(p->read.get(), buf, sizeof buf);
  ASSERT_TRUE(n);
  EXPECT_EQ(std::string(buf, *n), "hello");
  auto end = read_some(p->read.get(), buf, sizeof buf);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, 0u);
}

TEST(SocketPair, IsConnectedAndCloseOnExec) {
  auto s = make_socket_pair(SOCK_STREAM);
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_TRUE(is_cloexec(s->first.get()));
  ASSERT_TRUE(write_all(s->first.get(), "x", 1));
  char c = 0;
  ASSERT_TRUE(read_some(s->second.get(), &c, 1));
  EXPECT_EQ(c, 'x');
}

TEST(Child, WaitAnswersTheExitStatus) {
  auto child = Child::fork([] { return 7; });
  ASSERT_TRUE(child) << child.error().describe();
  EXPECT_GT(child->pid(), 0);
  auto status = child->wait();
  ASSERT_TRUE(status) << status.error().describe();
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 7);
  EXPECT_FALSE(child->running());
  EXPECT_EQ(*child->wait(), *status);  // cached, not a second waitpid
}

TEST(Child, PidfdBecomesReadableWhenTheChildEnds) {
  auto p = make_pipe();
  ASSERT_TRUE(p);
  const int go = p->read.get();
  auto child = Child::fork([go] {
    char c;
    return ::read(go, &c, 1) == 1 ? 0 : 1;  // ends when told
  });
  ASSERT_TRUE(child);
  EXPECT_FALSE(child->pidfd().wait_readable(0ms));
  EXPECT_FALSE(child->poll().has_value());
  ASSERT_TRUE(write_all(p->write.get(), "g", 1));
  EXPECT_TRUE(child->pidfd().wait_readable(10s));
  auto status = child->wait();
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

TEST(Child, TerminateSendsSigtermFirst) {
  auto child = Child::fork([] {
    ::pause();
    return 0;
  });
  ASSERT_TRUE(child);
  auto status = child->terminate(10s);
  ASSERT_TRUE(status) << status.error().describe();
  ASSERT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGTERM);
}

TEST(Child, TerminateKillsAChildThatIgnoresSigtermAfterTheGrace) {
  auto ready = make_pipe();
  ASSERT_TRUE(ready);
  const int w = ready->write.get();
  auto child = Child::fork([w] {
    ::signal(SIGTERM, SIG_IGN);
    (void)!::write(w, "r", 1);
    for (;;) {
      ::pause();
    }
    return 0;
  });
  ASSERT_TRUE(child);
  ready->write.reset();
  char c;
  ASSERT_TRUE(read_some(ready->read.get(), &c, 1));  // SIGTERM is ignored from here on
  const auto start = std::chrono::steady_clock::now();
  auto status = child->terminate(100ms);
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
}

TEST(Child, DestructorKillsAndReaps) {
  pid_t pid = 0;
  {
    auto child = Child::fork([] {
      ::pause();
      return 0;
    });
    ASSERT_TRUE(child);
    pid = child->pid();
  }
  // Reaped: no such child any more.
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(PidFd, OfOurselvesSignalsNothingHarmful) {
  auto self = PidFd::open(::getpid());
  ASSERT_TRUE(self) << self.error().describe();
  EXPECT_TRUE(self->signal(0));
  EXPECT_FALSE(self->wait_readable(0ms));
}

TEST(SeqpacketChannel, CarriesAMessageAndItsDescriptors) {
  auto pair = SeqpacketChannel::pair({.max_bytes = 64, .max_fds = 2});
  ASSERT_TRUE(pair) << pair.error().describe();
  auto [a, b] = std::move(pair).value();
  auto p = make_pipe();
  ASSERT_TRUE(p);
  const std::array<int, 1> fds = {p->write.get()};
  ASSERT_TRUE(a.send("hello", fds));
  auto m = b.receive();
  ASSERT_TRUE(m) << m.error().describe();
  ASSERT_TRUE(m->has_value());
  EXPECT_EQ((*m)->data, "hello");
  ASSERT_EQ((*m)->fds.size(), 1u);
  EXPECT_TRUE(is_cloexec((*m)->fds[0].get()));
  // The received descriptor is the pipe's write end.
  p->write.reset();
  ASSERT_TRUE(write_all((*m)->fds[0].get(), "z", 1));
  char c = 0;
  ASSERT_TRUE(read_some(p->read.get(), &c, 1));
  EXPECT_EQ(c, 'z');
}

TEST(SeqpacketChannel, MessageOfExactlyTheLimitPasses) {
  auto pair = SeqpacketChannel::pair({.max_bytes = 16, .max_fds = 0});
  ASSERT_TRUE(pair);
  ASSERT_TRUE(pair->first.send(std::string(16, 'a')));
  auto m = pair->second.receive();
  ASSERT_TRUE(m && m->has_value());
  EXPECT_EQ((*m)->data.size(), 16u);
}

TEST(SeqpacketChannel, RefusesToSendOversizeOrTooManyFds) {
  auto pair = SeqpacketChannel::pair({.max_bytes = 8, .max_fds = 1});
  ASSERT_TRUE(pair);
  auto big = pair->first.send(std::string(9, 'a'));
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().reason, "message_too_large");
  const std::array<int, 2> fds = {0, 1};
  auto many = pair->first.send("x", fds);
  ASSERT_FALSE(many);
  EXPECT_EQ(many.error().reason, "too_many_fds");
}

TEST(SeqpacketChannel, RefusesATruncatedMessageAndReadsTheNextOne) {
  // The sender's limit is larger than the receiver's: the receiver sees MSG_TRUNC.
  auto raw = make_socket_pair(SOCK_SEQPACKET);
  ASSERT_TRUE(raw);
  SeqpacketChannel sender(std::move(raw->first), {.max_bytes = 1024, .max_fds = 8});
  SeqpacketChannel receiver(std::move(raw->second), {.max_bytes = 8, .max_fds = 1});
  ASSERT_TRUE(sender.send(std::string(100, 'a')));
  ASSERT_TRUE(sender.send("next"));
  auto m = receiver.receive();
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(m.error().reason, "message_too_large");
  auto next = receiver.receive();
  ASSERT_TRUE(next && next->has_value());
  EXPECT_EQ((*next)->data, "next");
}

TEST(SeqpacketChannel, RefusesTooManyDescriptorsAndClosesThoseReceived) {
  auto raw = make_socket_pair(SOCK_SEQPACKET);
  ASSERT_TRUE(raw);
  SeqpacketChannel sender(std::move(raw->first), {.max_bytes = 64, .max_fds = 8});
  SeqpacketChannel receiver(std::move(raw->second), {.max_bytes = 64, .max_fds = 1});
  auto p = make_pipe();
  ASSERT_TRUE(p);
  const std::array<int, 3> fds = {p->write.get(), p->write.get(), p->write.get()};
  ASSERT_TRUE(sender.send("fds", fds));
  auto m = receiver.receive();
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().reason, "too_many_fds");
  // Every copy of the write end is closed again: closing ours ends the pipe.
  p->write.reset();
  char c;
  auto end = read_some(p->read.get(), &c, 1);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, 0u);
}

TEST(SeqpacketChannel, ReceiveAnswersNulloptWhenThePeerCloses) {
  auto pair = SeqpacketChannel::pair();
  ASSERT_TRUE(pair);
  (void)pair->first.release();  // UniqueFd returned and dropped: closed
  auto m = pair->second.receive();
  ASSERT_TRUE(m) << m.error().describe();
  EXPECT_FALSE(m->has_value());
  auto sent = pair->second.send("x");
  ASSERT_FALSE(sent);
  EXPECT_EQ(sent.error().code, ErrorCode::kUnavailable);
}

TEST(SeqpacketChannel, NonblockingReceiveSaysWouldBlock) {
  auto pair = SeqpacketChannel::pair();
  ASSERT_TRUE(pair);
  auto m = pair->second.receive(/*nonblocking=*/true);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().reason, "would_block");
}

TEST(DirStream, ListsEntriesWithoutDots) {
  TempDir dir;
  ASSERT_TRUE(atomic_write(dir.path() + "/a", "1"));
  ASSERT_EQ(::mkdir((dir.path() + "/sub").c_str(), 0700), 0);
  auto names = list_dir(dir.path());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "sub"}));
  auto missing = DirStream::open(dir.path() + "/nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST(Files, ReadWriteAndAtomicWrite) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  ASSERT_TRUE(atomic_write(path, "first", 0640));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(*read_file(path), "first");
  ASSERT_TRUE(write_file(path, "2nd"));
  EXPECT_EQ(*read_file(path), "2nd");
  EXPECT_EQ(*read_file(path, 2), "2n");  // bounded
  EXPECT_EQ(read_trimmed(path), "2nd");
  // write_file never creates: a control file that is missing must fail.
  EXPECT_FALSE(write_file(dir.path() + "/missing", "x"));
  auto optional = read_optional(dir.path() + "/missing");
  ASSERT_TRUE(optional);
  EXPECT_FALSE(optional->has_value());
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"f"});  // no temp file left
}

TEST(Proc, StatOfOurselves) {
  auto st = read_proc_stat(::getpid());
  ASSERT_TRUE(st) << st.error().describe();
  EXPECT_EQ(st->pid, ::getpid());
  EXPECT_EQ(st->ppid, ::getppid());
  EXPECT_FALSE(st->comm.empty());
  EXPECT_EQ(st->state, 'R');
  EXPECT_FALSE(st->start_time.empty());
}

TEST(Proc, StatWithSpacesAndParenthesesInTheCommand) {
  const std::string text =
      "42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 12345 1000 10 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
  auto st = parse_proc_stat(text);
  ASSERT_TRUE(st) << st.error().describe();
  EXPECT_EQ(st->pid, 42);
  EXPECT_EQ(st->comm, "a b) c)");
  EXPECT_EQ(st->state, 'S');
  EXPECT_EQ(st->ppid, 1);
  EXPECT_EQ(st->utime, 7u);
  EXPECT_EQ(st->cstime, 1u);
  EXPECT_EQ(st->start_time, "12345");
  EXPECT_EQ(proc_stat_field(text, 22), "12345");
  EXPECT_EQ(proc_stat_field(text, 3), "S");
  EXPECT_EQ(proc_stat_field(text, 999), "");
  EXPECT_FALSE(parse_proc_stat("garbage"));
  EXPECT_FALSE(parse_proc_stat("1 (x) S 1"));
}

TEST(Proc, StatusOfOurselves) {
  auto text = read_file("/proc/self/status");
  ASSERT_TRUE(text);
  EXPECT_EQ(status_field(*text, "Pid"), std::to_string(::getpid()));
  const auto uids = status_ids(*text, "Uid");
  ASSERT_EQ(uids.size(), 4u);
  EXPECT_EQ(uids[0], ::getuid());
  EXPECT_EQ(uids[1], ::geteuid());
  EXPECT_TRUE(read_status_field("self", "VmRSS").has_value());
  EXPECT_FALSE(status_field(*text, "NoSuchKey").has_value());
  EXPECT_FALSE(status_field("Pidx:\t1\n", "Pid").has_value());
}

TEST(Proc, CgroupAndMountinfoOfOurselves) {
  auto cgroup = read_file("/proc/self/cgroup");
  ASSERT_TRUE(cgroup);
  EXPECT_FALSE(parse_proc_cgroup(*cgroup).empty());
  auto lines = parse_proc_cgroup("0::/a:b\n4:memory,pids:/x\nbad\n");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].path, "/a:b");
  EXPECT_TRUE(lines[0].controllers.empty());
  EXPECT_EQ(lines[1].controllers, (std::vector<std::string>{"memory", "pids"}));

  auto mountinfo = read_file("/proc/self/mountinfo");
  ASSERT_TRUE(mountinfo);
  const auto mounts = parse_mountinfo(*mountinfo);
  EXPECT_TRUE(std::any_of(mounts.begin(), mounts.end(),
                          [](const MountInfo& m) { return m.mountpoint == "/proc"; }));
  const auto one = parse_mountinfo(
      "36 35 98:0 /mnt1 /mnt\\040x rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
      "short line\n");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].mountpoint, "/mnt x");
  EXPECT_EQ(one[0].root, "/mnt1");
  EXPECT_EQ(one[0].fstype, "ext3");
  EXPECT_EQ(one[0].source, "/dev/root");
  EXPECT_EQ(one[0].super_options, (std::vector<std::string>{"rw", "errors=continue"}));
}

TEST(Proc, EnvironAndCmdlineOfOurselves) {
  ::setenv("CELLGATE_SYS_TEST", "a=b", 1);  // not in /proc/self/environ (set after exec)
  auto env = read_environ(::getpid());
  ASSERT_TRUE(env) << env.error().describe();
  EXPECT_EQ(env->count("CELLGATE_SYS_TEST"), 0u);
  const auto parsed = parse_environ(std::string("A=1\0B=x=y\0noequals\0=v\0", 22));
  EXPECT_EQ(parsed, (std::map<std::string, std::string>{{"A", "1"}, {"B", "x=y"}}));
  EXPECT_EQ(parse_environ(std::string("A=1\0B=2\0", 8), 1).size(), 1u);

  auto cmdline = read_file("/proc/self/cmdline");
  ASSERT_TRUE(cmdline);
  const auto args = parse_cmdline(*cmdline);
  ASSERT_FALSE(args.empty());
  EXPECT_NE(args[0].find("cellgate_sys_tests"), std::string::npos);
  EXPECT_EQ(parse_cmdline(std::string("a\0\0b\0", 5)), (std::vector<std::string>{"a", "", "b"}));
}

TEST(Proc, ListPidsHasOurs) {
  const auto pids = list_pids();
  EXPECT_NE(std::find(pids.begin(), pids.end(), ::getpid()), pids.end());
}

TEST(Proc, OpenFdsHasAnOpenDescriptorAndNotAClosedOne) {
  auto pipe = make_pipe();
  ASSERT_TRUE(pipe.ok()) << pipe.error().message;
  const int kept = pipe->read.get();
  const int closed = pipe->write.get();
  pipe->write.reset();
  const auto fds = open_fds();
  EXPECT_NE(std::find(fds.begin(), fds.end(), kept), fds.end());
  EXPECT_EQ(std::find(fds.begin(), fds.end(), closed), fds.end());
  EXPECT_NE(std::find(fds.begin(), fds.end(), STDERR_FILENO), fds.end());
}

TEST(ErrorText, SaysWhatStrerrorSays) {
  EXPECT_EQ(error_text(ENOENT), "No such file or directory");
  EXPECT_EQ(error_text(EACCES), "Permission denied");
  EXPECT_EQ(error_text(0), "Success");
  EXPECT_EQ(error_text(99999), "Unknown error 99999");
  EXPECT_EQ(error_text(-1), "Unknown error -1");
}

}  // namespace
}  // namespace cellgate::sys
