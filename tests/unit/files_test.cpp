// The files API's filesystem half (cellgate/server/files.hpp) against a real directory that plays
// a hostile kernel's work dir: symlinks out of it (absolute and ../..), a FIFO, a socket, deep
// trees, and a thread that swaps a directory for a symlink while we work. Every escape test checks
// that a canary directory beside the work dir is exactly as it was. Ownership needs root (chown to
// another uid) and skips without it; everything else runs as any user.
#include "cellgate/store/files.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/sys/error_text.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::store::files {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::size_t kMax = 1 << 20;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists_nofollow(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Every path under `dir` (symlinks not followed) with a regular file's content, or "<dir>",
// "<link:target>", "<other>".
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(entry.path(), dir).string();
    if (entry.is_symlink()) {
      out[rel] = "<link:" + fs::read_symlink(entry.path()).string() + ">";
    } else if (entry.is_directory()) {
      out[rel] = "<dir>";
    } else if (entry.is_regular_file()) {
      out[rel] = read_text(entry.path());
    } else {
      out[rel] = "<other>";
    }
  }
  return out;
}

void expect_reason(const Error& error, const std::string& reason, ErrorCode code) {
  EXPECT_EQ(error.reason, reason) << error.describe();
  EXPECT_EQ(error.code, code) << error.describe();
  EXPECT_FALSE(error.message.empty());
}

template <typename T>
void expect_error(const Result<T>& result, const std::string& reason, ErrorCode code) {
  ASSERT_FALSE(result.ok()) << "expected " << reason;
  expect_reason(result.error(), reason, code);
}

void expect_escape(const auto& result) {
  expect_error(result, "path_escape", ErrorCode::kPermissionDenied);
}

// base/root is the work dir; base/outside holds a canary a kernel must never reach.
class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/cellgate-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << cellgate::sys::error_text(errno);
    base_ = pattern;
    root_ = base_ / "root";
    outside_ = base_ / "outside";
    fs::create_directory(root_);
    fs::create_directory(outside_);
    write_text(outside_ / "canary.txt", "canary");
    write_text(outside_ / "only-outside.txt", "a name no work-dir path may show");
    outside_before_ = tree(outside_);
    auto opened = WorkDir::open(root_.string(), ::getuid(), ::getgid());
    ASSERT_TRUE(opened.ok()) << opened.error().describe();
    dir_.emplace(std::move(opened).value());
  }

  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);  // does not follow symlinks
  }

  void expect_outside_untouched() {
    EXPECT_EQ(tree(outside_), outside_before_);
    std::vector<std::string> top;
    for (const auto& entry : fs::directory_iterator(base_)) {
      top.push_back(entry.path().filename().string());
    }
    std::sort(top.begin(), top.end());
    EXPECT_EQ(top, (std::vector<std::string>{"outside", "root"}));
  }

  // The names in a work-dir directory, temp files included.
  std::vector<std::string> names(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(dir)) {
      out.push_back(entry.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path base_, root_, outside_;
  std::map<std::string, std::string> outside_before_;
  std::optional<WorkDir> dir_;
};

TEST(FilesNormalize, CollapsesDotsAndSlashes) {
  EXPECT_EQ(normalize("a").value(), "a");
  EXPECT_EQ(normalize("a//./b/").value(), "a/b");
  EXPECT_EQ(normalize("./x/./y").value(), "x/y");
  EXPECT_EQ(normalize("..a/b..").value(), "..a/b..");  // only a whole ".." component is refused
}

TEST(FilesNormalize, RejectsEscapesAndJunk) {
  const std::vector<std::string> bad = {"",
                                        "/etc/passwd",
                                        "..",
                                        "../x",
                                        "a/../../b",
                                        "a/..",
                                        ".",
                                        "./",
                                        "//",
                                        std::string("a\0b", 3),
                                        std::string(PATH_MAX, 'a')};
  for (const std::string& path : bad) {
    SCOPED_TRACE(testing::Message() << "path of " << path.size() << " bytes: " << path.c_str());
    expect_error(normalize(path), "bad_path", ErrorCode::kInvalidArgument);
  }
}

TEST_F(FilesTest, OpenMissingWorkDirFails) {
  auto opened = WorkDir::open((base_ / "nope").string(), 0, 0);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().reason, "no_work_dir");
}

TEST_F(FilesTest, WriteThenReadRoundTrips) {
  const std::string data("binary\0data\xff\n", 13);
  auto info = dir_->write("notes.bin", data, kMax, false);
  ASSERT_TRUE(info.ok()) << info.error().describe();
  EXPECT_EQ(info->name, "notes.bin");
  EXPECT_EQ(info->path, "notes.bin");
  EXPECT_EQ(info->type, FileType::kFile);
  EXPECT_EQ(info->size, data.size());
  EXPECT_GT(info->mtime_ns, 0);
  EXPECT_EQ(read_text(root_ / "notes.bin"), data);

  auto back = dir_->read(".//notes.bin", kMax);
  ASSERT_TRUE(back.ok()) << back.error().describe();
  EXPECT_EQ(*back, data);
  EXPECT_EQ(names(root_), (std::vector<std::string>{"notes.bin"}));  // no temp left behind
}

TEST_F(FilesTest, WriteReplacesAtomically) {
  ASSERT_TRUE(dir_->write("f.txt", "version one", kMax, false).ok());
  struct stat before {};
  ASSERT_EQ(::stat((root_ / "f.txt").c_str(), &before), 0);
  UniqueFd old(::open((root_ / "f.txt").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(old);

  auto info = dir_->write("f.txt", "v2", kMax, false);
  ASSERT_TRUE(info.ok()) << info.error().describe();

  // A new inode took the name; a reader holding the old file still sees all of the old content
  // (an in-place truncate-and-write would show "v2" or nothing).
  struct stat after {};
  ASSERT_EQ(::stat((root_ / "f.txt").c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino);
  char buf[64] = {};
  ASSERT_EQ(::pread(old.get(), buf, sizeof(buf), 0), 11);
  EXPECT_EQ(std::string(buf, 11), "version one");
  EXPECT_EQ(dir_->read("f.txt", kMax).value(), "v2");
  EXPECT_EQ(names(root_), (std::vector<std::string>{"f.txt"}));
}

TEST_F(FilesTest, WriteNeedsParentsUnlessAsked) {
  expect_error(dir_->write("a/b/c.txt", "x", kMax, false), "not_found", ErrorCode::kNotFound);
  EXPECT_FALSE(exists_nofollow(root_ / "a"));

  fs::create_directory(root_ / "a");
  auto info = dir_->write("a/b/c.txt", "deep", kMax, true);
  ASSERT_TRUE(info.ok()) << info.error().describe();
  EXPECT_EQ(info->path, "a/b/c.txt");
  EXPECT_EQ(info->name, "c.txt");
  EXPECT_EQ(read_text(root_ / "a/b/c.txt"), "deep");
  struct stat st {};
  ASSERT_EQ(::stat((root_ / "a/b").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);

  // A file where a directory should be.
  write_text(root_ / "plain", "p");
  expect_error(dir_->write("plain/x", "x", kMax, true), "not_found", ErrorCode::kNotFound);
}

TEST_F(FilesTest, WriteOverDirectoryIsRefusedAndLeavesNoTemp) {
  fs::create_directory(root_ / "d");
  expect_error(dir_->write("d", "x", kMax, false), "not_a_file", ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_directory(root_ / "d"));
  EXPECT_EQ(names(root_), (std::vector<std::string>{"d"}));
}

TEST_F(FilesTest, WriteSizeCap) {
  expect_error(dir_->write("big", std::string(11, 'x'), 10, false), "too_large",
               ErrorCode::kResourceExhausted);
  EXPECT_TRUE(names(root_).empty());  // nothing written, not even a temp file
  ASSERT_TRUE(dir_->write("big", std::string(10, 'x'), 10, false).ok());
  EXPECT_EQ(fs::file_size(root_ / "big"), 10u);
}

TEST_F(FilesTest, ReadSizeCap) {
  write_text(root_ / "eleven", std::string(11, 'y'));
  expect_error(dir_->read("eleven", 10), "too_large", ErrorCode::kResourceExhausted);
  EXPECT_EQ(dir_->read("eleven", 11).value(), std::string(11, 'y'));
  write_text(root_ / "empty", "");
  EXPECT_EQ(dir_->read("empty", 0).value(), "");
}

TEST_F(FilesTest, ReadMissingIsNotFound) {
  expect_error(dir_->read("nope.txt", kMax), "not_found", ErrorCode::kNotFound);
  expect_error(dir_->read("no/such/dir.txt", kMax), "not_found", ErrorCode::kNotFound);
  expect_error(dir_->read("../outside/canary.txt", kMax), "bad_path", ErrorCode::kInvalidArgument);
}

TEST_F(FilesTest, SymlinksOutOfTheWorkDirAreRefused) {
  fs::create_symlink("/etc", root_ / "escape");
  fs::create_symlink(outside_, root_ / "out");  // absolute
  fs::create_directory(root_ / "a");
  fs::create_symlink("../..", root_ / "a" / "up");  // relative: a/up is base_
  const auto root_before = tree(root_);

  expect_escape(dir_->read("escape/passwd", kMax));
  expect_escape(dir_->read("out/canary.txt", kMax));
  expect_escape(dir_->read("a/up/outside/canary.txt", kMax));

  expect_escape(dir_->write("out/new.txt", "pwned", kMax, false));
  expect_escape(dir_->write("out/canary.txt", "pwned", kMax, false));
  expect_escape(dir_->write("out/sub/new.txt", "pwned", kMax, true));
  expect_escape(dir_->write("a/up/outside/new.txt", "pwned", kMax, true));
  expect_escape(dir_->write("a/up/new.txt", "pwned", kMax, false));
  const fs::path in_etc = "/etc/cellgate-files-test-must-not-exist";
  expect_escape(dir_->write("escape/cellgate-files-test-must-not-exist", "x", kMax, false));
  EXPECT_FALSE(exists_nofollow(in_etc));
  if (exists_nofollow(in_etc)) {
    fs::remove(in_etc);
  }

  expect_escape(dir_->remove("out/canary.txt"));
  expect_escape(dir_->remove("a/up/outside/canary.txt"));
  expect_escape(dir_->remove("a/up/outside"));

  expect_escape(dir_->list("out"));  // a symlink as the directory itself
  expect_escape(dir_->list("a/up/outside"));
  expect_escape(dir_->list("escape"));

  expect_outside_untouched();
  EXPECT_EQ(tree(root_), root_before);
}

TEST_F(FilesTest, SymlinksInsideTheWorkDirAreFollowedInTheMiddle) {
  fs::create_directory(root_ / "sub");
  write_text(root_ / "sub" / "f", "inside");
  fs::create_symlink("sub", root_ / "alias");
  fs::create_directory(root_ / "x");
  fs::create_symlink("../sub", root_ / "x" / "back");

  EXPECT_EQ(dir_->read("alias/f", kMax).value(), "inside");
  EXPECT_EQ(dir_->read("x/back/f", kMax).value(), "inside");
  ASSERT_TRUE(dir_->write("alias/g", "via alias", kMax, false).ok());
  EXPECT_EQ(read_text(root_ / "sub" / "g"), "via alias");
}

TEST_F(FilesTest, FinalSymlinkIsNotFollowedByRead) {
  write_text(root_ / "target", "inside");
  fs::create_symlink("target", root_ / "link");
  fs::create_symlink(outside_ / "canary.txt", root_ / "outlink");
  expect_escape(dir_->read("link", kMax));
  expect_escape(dir_->read("outlink", kMax));
  expect_outside_untouched();
}

TEST_F(FilesTest, RemoveRemovesTheLinkNotItsTarget) {
  fs::create_symlink(outside_ / "canary.txt", root_ / "outlink");
  fs::create_symlink(outside_, root_ / "out");
  ASSERT_TRUE(dir_->remove("outlink").ok());
  ASSERT_TRUE(dir_->remove("out").ok());
  EXPECT_FALSE(exists_nofollow(root_ / "outlink"));
  EXPECT_FALSE(exists_nofollow(root_ / "out"));
  expect_outside_untouched();
}

TEST_F(FilesTest, WriteOverSymlinkReplacesTheLinkNotItsTarget) {
  fs::create_symlink(outside_ / "canary.txt", root_ / "outlink");
  ASSERT_TRUE(dir_->write("outlink", "mine", kMax, false).ok());
  EXPECT_FALSE(fs::is_symlink(root_ / "outlink"));
  EXPECT_EQ(read_text(root_ / "outlink"), "mine");
  expect_outside_untouched();
}

TEST_F(FilesTest, RemoveFilesAndEmptyDirectories) {
  write_text(root_ / "f", "x");
  fs::create_directories(root_ / "empty");
  fs::create_directories(root_ / "full");
  write_text(root_ / "full" / "x", "x");

  ASSERT_TRUE(dir_->remove("f").ok());
  EXPECT_FALSE(exists_nofollow(root_ / "f"));
  ASSERT_TRUE(dir_->remove("empty/").ok());
  EXPECT_FALSE(exists_nofollow(root_ / "empty"));
  expect_error(dir_->remove("full"), "not_empty", ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(exists_nofollow(root_ / "full" / "x"));
  ASSERT_TRUE(dir_->remove("full/x").ok());
  expect_error(dir_->remove("f"), "not_found", ErrorCode::kNotFound);
  expect_error(dir_->remove(""), "bad_path", ErrorCode::kInvalidArgument);
}

TEST_F(FilesTest, ReadRefusesFifoWithoutBlocking) {
  const fs::path fifo = root_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0) << cellgate::sys::error_text(errno);
  std::promise<Result<std::string>> done;
  auto answer = done.get_future();
  std::thread reader([&] { done.set_value(dir_->read("pipe", kMax)); });
  if (answer.wait_for(5s) != std::future_status::ready) {
    ADD_FAILURE() << "read() blocked on a FIFO";
    UniqueFd unblock(::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));  // lets it return
  }
  reader.join();
  expect_error(answer.get(), "not_a_file", ErrorCode::kFailedPrecondition);
}

TEST_F(FilesTest, ReadRefusesDirectoriesAndSockets) {
  fs::create_directory(root_ / "d");
  expect_error(dir_->read("d", kMax), "not_a_file", ErrorCode::kFailedPrecondition);

  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(sock);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = (root_ / "sock").string();
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << cellgate::sys::error_text(errno);
  expect_error(dir_->read("sock", kMax), "not_a_file", ErrorCode::kFailedPrecondition);
}

TEST_F(FilesTest, ListDoesNotFollowSymlinks) {
  write_text(root_ / "f", "abc");
  fs::create_directory(root_ / "d");
  write_text(root_ / "d" / "inner", "12345");
  fs::create_symlink("/etc", root_ / "escape");
  ASSERT_EQ(::mkfifo((root_ / "pipe").c_str(), 0666), 0);

  auto listing = dir_->list("");
  ASSERT_TRUE(listing.ok()) << listing.error().describe();
  EXPECT_FALSE(listing->truncated);
  ASSERT_EQ(listing->entries.size(), 4u);
  const auto& e = listing->entries;
  EXPECT_EQ(e[0].name, "d");
  EXPECT_EQ(e[0].type, FileType::kDirectory);
  EXPECT_EQ(e[1].name, "escape");
  EXPECT_EQ(e[1].type, FileType::kSymlink);
  EXPECT_EQ(e[1].size, 4u);  // strlen("/etc"): the link, not the directory it names
  EXPECT_EQ(e[2].name, "f");
  EXPECT_EQ(e[2].type, FileType::kFile);
  EXPECT_EQ(e[2].size, 3u);
  EXPECT_EQ(e[2].path, "f");
  EXPECT_GT(e[2].mtime_ns, 0);
  EXPECT_EQ(e[3].name, "pipe");
  EXPECT_EQ(e[3].type, FileType::kOther);
  EXPECT_STREQ(to_string(e[3].type), "other");

  auto sub = dir_->list("d");
  ASSERT_TRUE(sub.ok()) << sub.error().describe();
  ASSERT_EQ(sub->entries.size(), 1u);
  EXPECT_EQ(sub->entries[0].path, "d/inner");
  EXPECT_EQ(sub->entries[0].size, 5u);

  expect_error(dir_->list("f"), "not_a_directory", ErrorCode::kFailedPrecondition);
  expect_error(dir_->list("missing"), "not_found", ErrorCode::kNotFound);
  expect_escape(dir_->list("escape"));
}

TEST_F(FilesTest, ListIsCapped) {
  for (const char* name : {"a", "b", "c"}) {
    write_text(root_ / name, name);
  }
  auto listing = dir_->list("", 2);
  ASSERT_TRUE(listing.ok()) << listing.error().describe();
  EXPECT_TRUE(listing->truncated);
  EXPECT_EQ(listing->entries.size(), 2u);
  auto all = dir_->list("", 3);
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->truncated);
  EXPECT_EQ(all->entries.size(), 3u);
}

TEST_F(FilesTest, SnapshotDiffFindsCreatedModifiedDeleted) {
  fs::create_directory(root_ / "d");
  write_text(root_ / "d" / "grows.txt", "a");
  write_text(root_ / "same_size.txt", "abc");
  write_text(root_ / "untouched.txt", "u");
  write_text(root_ / "gone.txt", "bye");
  auto before = dir_->snapshot();
  ASSERT_TRUE(before.ok()) << before.error().describe();
  EXPECT_FALSE(before->truncated);
  EXPECT_EQ(before->entries.size(), 5u);

  // Timestamps come from a coarse clock: let it tick so that the rewrites below get new ones.
  std::this_thread::sleep_for(20ms);
  write_text(root_ / "d" / "grows.txt", "abcdef");
  struct stat old_st {};
  ASSERT_EQ(::stat((root_ / "same_size.txt").c_str(), &old_st), 0);
  write_text(root_ / "same_size.txt", "xyz");
  const timespec times[2] = {old_st.st_atim, old_st.st_mtim};  // a kernel hiding its write
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ / "same_size.txt").c_str(), times, 0), 0);
  fs::remove(root_ / "gone.txt");
  fs::create_directory(root_ / "new_dir");
  write_text(root_ / "new_dir" / "out.csv", "1,2");

  auto after = dir_->snapshot();
  ASSERT_TRUE(after.ok()) << after.error().describe();
  const auto changes = diff(*before, *after);
  std::vector<std::string> seen;
  for (const Change& c : changes) {
    seen.push_back(std::string(to_string(c.kind)) + " " + c.path + " " + to_string(c.type) + " " +
                   std::to_string(c.size));
  }
  EXPECT_EQ(seen,
            (std::vector<std::string>{
                "modified d/grows.txt file 6",
                "deleted gone.txt file 3",
                "created new_dir directory " + std::to_string(after->entries.at("new_dir").size),
                "created new_dir/out.csv file 3",
                "modified same_size.txt file 3",
            }));
  EXPECT_TRUE(diff(*after, *after).empty());
}

TEST(FilesDiff, TypeChangeIsAModificationAndDirectoryTimesAreNot) {
  Snapshot before;
  before.entries["x"] = EntryState{FileType::kFile, 1, 10, 10};
  before.entries["d"] = EntryState{FileType::kDirectory, 40, 10, 10};
  Snapshot after;
  after.entries["x"] = EntryState{FileType::kSymlink, 4, 20, 20};
  after.entries["d"] = EntryState{FileType::kDirectory, 60, 20, 20};
  const auto changes = diff(before, after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kind, ChangeKind::kModified);
  EXPECT_EQ(changes[0].path, "x");
  EXPECT_EQ(changes[0].type, FileType::kSymlink);
}

TEST_F(FilesTest, SnapshotDoesNotFollowSymlinksAndIsBounded) {
  fs::create_symlink("/etc", root_ / "escape");
  fs::create_symlink(outside_, root_ / "out");
  fs::path deep = root_;
  for (int i = 0; i < 40; ++i) {
    deep /= "d";
  }
  fs::create_directories(deep);

  auto snap = dir_->snapshot();
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_TRUE(snap->truncated);  // the tree is deeper than kMaxSnapshotDepth
  EXPECT_EQ(snap->entries.at("escape").type, FileType::kSymlink);
  EXPECT_EQ(snap->entries.at("out").type, FileType::kSymlink);
  std::size_t deepest = 0;
  for (const auto& [path, state] : snap->entries) {
    EXPECT_NE(path.rfind("escape/", 0), 0u) << path;
    EXPECT_NE(path.rfind("out/", 0), 0u) << path;
    deepest = std::max<std::size_t>(deepest, std::count(path.begin(), path.end(), '/') + 1);
  }
  EXPECT_EQ(deepest, static_cast<std::size_t>(kMaxSnapshotDepth));
  EXPECT_EQ(snap->entries.size(), 2u + kMaxSnapshotDepth);

  auto capped = dir_->snapshot(5);
  ASSERT_TRUE(capped.ok());
  EXPECT_TRUE(capped->truncated);
  EXPECT_EQ(capped->entries.size(), 5u);
}

// A kernel swapping a directory for a symlink to outside as fast as it can, while the gateway
// works on paths through it: each call may fail, but none may touch anything outside.
TEST_F(FilesTest, RacingSymlinkSwapNeverEscapes) {
  fs::create_directory(root_ / "sw");
  write_text(root_ / "sw" / "canary.txt", "inside");
  fs::create_symlink(outside_, root_ / "lnk");
  std::atomic<long> swaps{0};
  std::jthread kernel([&](const std::stop_token& stop) {  // joined on every way out
    while (!stop.stop_requested()) {
      if (::renameat2(AT_FDCWD, (root_ / "sw").c_str(), AT_FDCWD, (root_ / "lnk").c_str(),
                      RENAME_EXCHANGE) == 0) {
        swaps.fetch_add(1);
      }
    }
  });
  int escapes = 0;
  for (int i = 0; i < 2000; ++i) {
    auto wrote = dir_->write("sw/canary.txt", "pwned", kMax, false);
    escapes += !wrote.ok() && wrote.error().reason == "path_escape" ? 1 : 0;
    (void)dir_->read("sw/canary.txt", kMax);
    (void)dir_->remove("sw/canary.txt");
    (void)dir_->write("sw/new/x.txt", "pwned", kMax, true);
    (void)dir_->remove("sw/new/x.txt");
    (void)dir_->list("sw");
    auto snap = dir_->snapshot();
    ASSERT_TRUE(snap.ok()) << snap.error().describe();
    for (const auto& [path, state] : snap->entries) {
      ASSERT_EQ(path.find("only-outside"), std::string::npos) << "the walk left the root";
    }
  }
  kernel.request_stop();
  kernel.join();
  EXPECT_GT(swaps.load(), 0);
  RecordProperty("escapes_refused", escapes);
  expect_outside_untouched();
}

TEST_F(FilesTest, WrittenFilesBelongToTheKernelUser) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "chown to another uid needs root";
  }
  auto opened = WorkDir::open(root_.string(), 12345, 12346);
  ASSERT_TRUE(opened.ok()) << opened.error().describe();
  const mode_t old_umask = ::umask(077);  // the mode must not depend on the gateway's umask
  auto info = opened->write("p/q/owned.txt", "x", kMax, true);
  ::umask(old_umask);
  ASSERT_TRUE(info.ok()) << info.error().describe();
  for (const auto& [path, mode] : std::vector<std::pair<fs::path, mode_t>>{
           {root_ / "p/q/owned.txt", 0644}, {root_ / "p/q", 0755}, {root_ / "p", 0755}}) {
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_uid, 12345u) << path;
    EXPECT_EQ(st.st_gid, 12346u) << path;
    EXPECT_EQ(st.st_mode & 07777, mode) << path;
  }
}

}  // namespace
}  // namespace cellgate::store::files
