// cellgate::checkpoint without root or CRIU: the choice of CRIU (criu.hpp) with fake criu
// programs, and the image store (images.hpp) in a temp dir.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/checkpoint/images.hpp"
#include "cellgate/checkpoint/rebase.hpp"

namespace cellgate {
namespace {

TEST(CriuVersionTest, ComparesNumerically) {
  EXPECT_TRUE(checkpoint::version_at_least("4.2", 4, 2));
  EXPECT_TRUE(checkpoint::version_at_least("4.2.1", 4, 2));
  EXPECT_TRUE(checkpoint::version_at_least("4.10", 4, 2));
  EXPECT_TRUE(checkpoint::version_at_least("5.0", 4, 2));
  EXPECT_FALSE(checkpoint::version_at_least("4.1.1", 4, 2));
  EXPECT_FALSE(checkpoint::version_at_least("3.17.1", 4, 2));
  EXPECT_FALSE(checkpoint::version_at_least("", 4, 2));
  EXPECT_FALSE(checkpoint::version_at_least("four", 4, 2));
}

class FakeCriuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/cellgate-criu-test-XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    ::unsetenv("CELLGATE_CRIU");
    ::unlink((dir_ + "/criu").c_str());
    ::rmdir(dir_.c_str());
  }
  // A criu that prints `version` and answers `check` with `check_exit`, chosen by CELLGATE_CRIU.
  void fake(const std::string& version, int check_exit) {
    const std::string path = dir_ + "/criu";
    std::ofstream(path) << "#!/bin/sh\n"
                        << "case \"$1\" in\n"
                        << "  --version) echo 'Version: " << version << "' ;;\n"
                        << "  check) echo 'Error (criu/kerndat.c:1): no vdso' >&2; exit "
                        << check_exit << " ;;\n"
                        << "esac\n";
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
    ::setenv("CELLGATE_CRIU", path.c_str(), 1);
  }
  std::string dir_;
};

TEST_F(FakeCriuTest, TooOldIsNamedWithWhatToDo) {
  fake("3.17.1", 0);
  const auto s = checkpoint::probe_criu();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.reason.find("version 3.17.1"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("scripts/install-criu"), std::string::npos) << s.reason;
  EXPECT_FALSE(checkpoint::find_criu().ok());
}

TEST_F(FakeCriuTest, MissingIsNamed) {
  ::setenv("CELLGATE_CRIU", (dir_ + "/absent").c_str(), 1);
  const auto s = checkpoint::probe_criu();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.describe().find("checkpoints unavailable: no CRIU"), std::string::npos)
      << s.describe();
}

TEST_F(FakeCriuTest, RecentEnoughMustPassCheckAsRoot) {
  fake("4.2.1", 1);
  const auto found = checkpoint::find_criu();
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, dir_ + "/criu");
  const auto s = checkpoint::probe_criu();
  EXPECT_FALSE(s.available);
  EXPECT_EQ(s.version, "4.2.1");
  if (::geteuid() == 0) {
    EXPECT_NE(s.reason.find("no vdso"), std::string::npos) << s.reason;  // check's own error
  } else {
    EXPECT_NE(s.reason.find("needs root"), std::string::npos) << s.reason;
  }
}

TEST_F(FakeCriuTest, AvailableWhenCheckPasses) {
  fake("4.2.1", 0);
  const auto s = checkpoint::probe_criu();
  EXPECT_EQ(s.available, ::geteuid() == 0) << s.reason;
  if (s.available) {
    EXPECT_NE(s.describe().find("CRIU 4.2.1"), std::string::npos);
  }
}

class ImageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/cellgate-images-test-XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ImageStoreTest, IdsAreTheOnlyNames) {
  auto store = checkpoint::ImageStore::open(dir_ + "/images");
  ASSERT_TRUE(store.ok()) << store.error().describe();
  auto id = store->reserve();
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(checkpoint::ImageStore::valid_id(*id));
  EXPECT_NE(*store->reserve(), *id);
  EXPECT_FALSE(store->find(*id).ok());  // reserved, not made
  ASSERT_EQ(::mkdir(store->dir_of(*id).c_str(), 0700), 0);
  std::ofstream(store->dir_of(*id) + "/pages-1.img") << "memory";
  EXPECT_EQ(*store->find(*id), dir_ + "/images/" + *id);
  EXPECT_EQ(store->list(), std::vector<std::string>{*id});
  EXPECT_EQ(store->used_bytes(), 6u);
  // A file beside the images (the store's parent, say) cannot be named.
  std::ofstream(dir_ + "/secret") << "x";
  for (const std::string& bad :
       std::vector<std::string>{"", "..", "../secret", "/etc", std::string(32, 'A'),
                                id->substr(0, 31), *id + "/..", *id + "0"}) {
    const auto found = store->find(bad);
    ASSERT_FALSE(found.ok()) << bad;
    EXPECT_EQ(found.error().reason, "no_image");
    EXPECT_FALSE(store->remove(bad).ok()) << bad;
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/secret"));
  ASSERT_TRUE(store->remove(*id).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/images/" + *id));
  EXPECT_EQ(store->remove(*id).error().reason, "no_image");
}

TEST_F(ImageStoreTest, RemovingAnImageNeverFollowsItsLinks) {
  auto store = checkpoint::ImageStore::open(dir_ + "/images");
  ASSERT_TRUE(store.ok());
  const std::string id = *store->reserve();
  ASSERT_EQ(::mkdir(store->dir_of(id).c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir_ + "/outside").c_str(), 0700), 0);
  std::ofstream(dir_ + "/outside/kept") << "x";
  ASSERT_EQ(::symlink((dir_ + "/outside").c_str(), (store->dir_of(id) + "/link").c_str()), 0);
  ASSERT_TRUE(store->remove(id).ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/outside/kept"));
}

TEST_F(ImageStoreTest, TheBudgetRefusesWithNoSpace) {
  auto store = checkpoint::ImageStore::open(dir_ + "/images", 10);
  ASSERT_TRUE(store.ok());
  const std::string id = *store->reserve();
  ASSERT_EQ(::mkdir(store->dir_of(id).c_str(), 0700), 0);
  std::ofstream(store->dir_of(id) + "/pages-1.img") << "0123456789";
  const auto refused = store->reserve();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(refused.error().reason, "no_space");  // 507 (docs/errors.md)
}

TEST_F(ImageStoreTest, AStoreOthersCanOpenIsRefused) {
  ASSERT_EQ(::mkdir((dir_ + "/open").c_str(), 0755), 0);
  ASSERT_EQ(::chmod((dir_ + "/open").c_str(), 0755), 0);
  EXPECT_FALSE(checkpoint::ImageStore::open(dir_ + "/open").ok());
  ASSERT_EQ(::symlink((dir_ + "/open").c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_FALSE(checkpoint::ImageStore::open(dir_ + "/link").ok());
  const auto made = checkpoint::ImageStore::open(dir_ + "/made");
  ASSERT_TRUE(made.ok());
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/made").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// Protobuf wire bytes, as CRIU's images hold them.
std::string varint(std::uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string num(std::uint32_t field, std::uint64_t v) {
  return varint(field << 3) + varint(v);
}
std::string bytes(std::uint32_t field, const std::string& payload) {
  return varint((field << 3) | 2) + varint(payload.size()) + payload;
}
// An image file: the common magic, the image's, then [u32 size][record]s.
std::string image(const std::vector<std::string>& records) {
  std::string out("\x19\x43\x56\x54\x47\x38\x05\x55", 8);
  for (const auto& r : records) {
    const auto n = static_cast<std::uint32_t>(r.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(r);
  }
  return out;
}

const checkpoint::Rebase kCopy{2000002, 2000007, 2000002, 2000007, "k-1", "k-2"};

TEST(RebaseTest, CredentialsOfTheSourceBecomeTheCopys) {
  // creds: uid euid suid fsuid of the source, gid 0 (root's group stays), groups packed.
  const std::string creds = num(1, 2000002) + num(2, 0) + num(3, 2000002) + num(4, 2000002) +
                            num(5, 2000002) + num(6, 2000002) + num(7, 2000002) + num(8, 2000002) +
                            num(13, 0) + bytes(14, varint(2000002) + varint(5));
  const std::string core = num(1, 1) + bytes(5, num(1, 99) + bytes(10, creds));
  auto out = checkpoint::rebase_records("core-3.img", image({core}), kCopy);
  ASSERT_TRUE(out) << out.error().message;
  const std::string want_creds = num(1, 2000007) + num(2, 0) + num(3, 2000007) + num(4, 2000007) +
                                 num(5, 2000007) + num(6, 2000007) + num(7, 2000007) +
                                 num(8, 2000007) + num(13, 0) +
                                 bytes(14, varint(2000007) + varint(5));
  EXPECT_EQ(*out, image({num(1, 1) + bytes(5, num(1, 99) + bytes(10, want_creds))}));
}

TEST(RebaseTest, CgroupPathsChangeOnlyTheKernelsOwnComponent) {
  const std::string member =
      num(1, 1) + bytes(2, bytes(1, "memory") + bytes(2, "/parent/cellgate/k-1"));
  const std::string other = num(1, 2) + bytes(2, bytes(1, "pids") + bytes(2, "/cellgate/k-10"));
  const std::string dir = bytes(1, "parent/cellgate/k-1") + bytes(2, bytes(1, "k-1")) +
                          bytes(4, num(1, 0755) + num(2, 2000002) + num(3, 0));
  const std::string cg =
      bytes(1, member) + bytes(1, other) + bytes(2, bytes(1, "memory") + bytes(2, dir));
  auto out = checkpoint::rebase_records("cgroup.img", image({cg}), kCopy);
  ASSERT_TRUE(out) << out.error().message;
  const std::string want_member =
      num(1, 1) + bytes(2, bytes(1, "memory") + bytes(2, "/parent/cellgate/k-2"));
  const std::string want_dir = bytes(1, "parent/cellgate/k-2") + bytes(2, bytes(1, "k-2")) +
                               bytes(4, num(1, 0755) + num(2, 2000007) + num(3, 0));
  EXPECT_EQ(*out, image({bytes(1, want_member) + bytes(1, other) +
                         bytes(2, bytes(1, "memory") + bytes(2, want_dir))}));
}

TEST(RebaseTest, MalformedRecordsAreRefusedNotFollowed) {
  // A length past the record's end, a record past the file's end, an unknown wire type, and
  // nesting past the bound: each an error naming the file.
  const std::vector<std::string> bad = {
      image({num(1, 1) + varint((5 << 3) | 2) + varint(1000) + "xx"}),
      image({"abc"}).substr(0, 14),
      image({varint((1 << 3) | 3)}),
  };
  for (const auto& b : bad) {
    auto out = checkpoint::rebase_records("core-1.img", b, kCopy);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.error().reason, "checkpoint_image");
    EXPECT_NE(out.error().message.find("core-1.img"), std::string::npos) << out.error().message;
  }
  std::string deep = bytes(1, "x");
  for (int i = 0; i < 40; ++i) {
    deep = bytes(2, deep);  // cgroup dirs: children in children
  }
  auto out = checkpoint::rebase_records("cgroup.img", image({bytes(2, deep)}), kCopy);
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message.find("nest"), std::string::npos) << out.error().message;
}

}  // namespace
}  // namespace cellgate
