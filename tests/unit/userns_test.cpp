// Rootless mode's decisions on what /proc says (jail/userns.hpp); entering a namespace for real
// is tested in the systemd guest (tests/vm), as a non-root user.
#include "cellgate/jail/userns.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace cellgate::jail {
namespace {

namespace fs = std::filesystem;

TEST(UserNamespace, OnlyAMapOfUidZeroToAnotherUidIsTheRootlessOne) {
  EXPECT_TRUE(is_single_uid_map("         0       1001          1\n"));
  // The initial namespace maps everything.
  EXPECT_FALSE(is_single_uid_map("         0          0 4294967295\n"));
  // Real root mapped into a namespace is still root outside.
  EXPECT_FALSE(is_single_uid_map("0 0 1\n"));
  // A subordinate range (newuidmap): more than one uid.
  EXPECT_FALSE(is_single_uid_map("0 1001 1\n1 100000 65536\n"));
  EXPECT_FALSE(is_single_uid_map("1000 1001 1\n"));
  EXPECT_FALSE(is_single_uid_map(""));
  EXPECT_FALSE(is_single_uid_map("garbage"));
}

class Sysctls : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cellgate-userns-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void set(const std::string& name, const std::string& value) {
    fs::create_directories(fs::path(dir_ + "/" + name).parent_path());
    std::ofstream(dir_ + "/" + name) << value << "\n";
  }
  std::string dir_;
};

TEST_F(Sysctls, NamesTheSettingThatForbidsUserNamespaces) {
  EXPECT_EQ(user_namespace_blocker(dir_), "");
  set("kernel/unprivileged_userns_clone", "1");
  set("user/max_user_namespaces", "15000");
  set("kernel/apparmor_restrict_unprivileged_userns", "0");
  EXPECT_EQ(user_namespace_blocker(dir_), "");

  set("kernel/apparmor_restrict_unprivileged_userns", "1");
  EXPECT_NE(user_namespace_blocker(dir_).find("kernel.apparmor_restrict_unprivileged_userns=1"),
            std::string::npos);
  set("user/max_user_namespaces", "0");
  EXPECT_NE(user_namespace_blocker(dir_).find("user.max_user_namespaces=0"), std::string::npos);
  set("kernel/unprivileged_userns_clone", "0");
  EXPECT_NE(user_namespace_blocker(dir_).find("kernel.unprivileged_userns_clone=0"),
            std::string::npos);
}

TEST(SubordinateRanges, TheFirstLineNamingTheUserByNameOrUid) {
  const std::string subuid =
      "alice:100000:65536\n"
      "bob:165536:0\n"  // a zero count grants nothing
      "bob:x:5\n"       // nor does a malformed line
      "1001:231072:1000\n"
      "bob:300000:4096\n";
  EXPECT_EQ(find_subordinate_range(subuid, "alice", 1000).start, 100000u);
  EXPECT_EQ(find_subordinate_range(subuid, "alice", 1000).count, 65536u);
  EXPECT_EQ(find_subordinate_range(subuid, "carol", 1001).start, 231072u);  // by uid
  EXPECT_EQ(find_subordinate_range(subuid, "bob", 1002).start, 300000u);
  EXPECT_EQ(find_subordinate_range(subuid, "dave", 1003).count, 0u);
  EXPECT_EQ(find_subordinate_range("", "alice", 1000).count, 0u);
}

TEST(SubordinateRanges, KernelUidsAreTheRangeMappedBesideTheGateway) {
  // newuidmap's two lines: the user as 0, the subordinate range from 1.
  auto r = kernel_uid_range_of_map(
      "         0       1000          1\n"
      "         1     100000      65536\n");
  EXPECT_EQ(r.first, 1u);
  EXPECT_EQ(r.count, 65536u);
  // The single mapping and real root map no range for kernels.
  EXPECT_EQ(kernel_uid_range_of_map("0 1000 1\n").count, 0u);
  EXPECT_EQ(kernel_uid_range_of_map("0 0 4294967295\n").count, 0u);
  EXPECT_EQ(kernel_uid_range_of_map("").count, 0u);
}

}  // namespace
}  // namespace cellgate::jail
