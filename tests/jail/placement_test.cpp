// The jail tests' cgroup placement (placement.hpp), done once before any test, and a test of it
// on this host.
#include "placement.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/userns.hpp"

namespace cellgate::jail::testing {
namespace {

std::string g_parent;
std::string g_summary;

// Not root: the binary does what a rootless gateway does (jail/README.md, "Rootless mode"),
// before main, while it has one thread: places the kernels' cgroups as the user, then enters a
// user namespace of its own, where it is root and every test runs as under real root.
const bool g_rootless = [] {
  if (::geteuid() == 0) {
    return false;
  }
  CgroupPlacementRequest request;
  request.leaf_name = "jail-tests";
  if (auto placed = place_kernel_cgroups(request); placed) {
    g_parent = placed->parent;
    g_summary = placed->summary;
    std::cerr << "jail tests: cgroups: " << g_summary << "\n";
  } else {
    std::cerr << "jail tests: kernels' cgroups not arranged: " << placed.error().message << "\n";
  }
  auto ns = enter_gateway_user_namespace();
  if (!ns) {
    std::cerr << "jail tests: not rootless: " << ns.error().message << "\n";
    return false;
  }
  std::cerr << "jail tests: " << ns->summary << "\n";
  return true;
}();

class PlacementEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (::geteuid() != 0 || g_rootless) {
      return;
    }
    CgroupPlacementRequest request;
    request.leaf_name = "jail-tests";
    auto placed = place_kernel_cgroups(request);
    if (!placed) {
      // The tests that need cgroups then fail or skip with their own reasons.
      std::cerr << "jail tests: kernels' cgroups not arranged: " << placed.error().message << "\n";
      return;
    }
    g_parent = placed->parent;
    g_summary = placed->summary;
    std::cerr << "jail tests: cgroups: " << g_summary << "\n";
  }
};

[[maybe_unused]] ::testing::Environment* const placement_environment =
    ::testing::AddGlobalTestEnvironment(new PlacementEnvironment);

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CgroupPlacementReal, KernelsCgroupsGetEveryController) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root";
  }
  auto host = CgroupHost::detect_system(g_parent);
  ASSERT_TRUE(host) << host.error().describe();
  if (host->version() == CgroupVersion::kV1) {
    EXPECT_EQ(g_parent, "") << "v1 needs no placement";
    return;
  }
  // v2: the binary left its cgroup for a leaf if it had to, and memory, pids and cpu are enabled
  // where the kernels' groups are made.
  EXPECT_TRUE(host->has_controller("memory") && host->has_controller("pids") &&
              host->has_controller("cpu"))
      << host->describe() << "; placement: " << g_summary;
  if (!g_parent.empty()) {
    const std::string base = g_parent == "/" ? "" : g_parent;  // a cgroup namespace's root
    EXPECT_NE(read_text("/proc/self/cgroup").find(base + "/jail-tests\n"), std::string::npos)
        << read_text("/proc/self/cgroup");
  }
}

}  // namespace

const std::string& cgroup_parent() {
  return g_parent;
}

bool has_net_admin() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) == 0) {
      constexpr unsigned long long kNetAdmin = 1ull << 12;  // CAP_NET_ADMIN
      return (std::stoull(line.substr(7), nullptr, 16) & kNetAdmin) != 0;
    }
  }
  return false;
}

bool rootless() {
  return g_rootless;
}

const std::string& bin_dir() {
  static const std::string dir = [] {
    const char* env = std::getenv("CELLGATE_TEST_BIN_DIR");
    return std::string(env != nullptr && *env != '\0' ? env : CELLGATE_BIN_DIR);
  }();
  return dir;
}

}  // namespace cellgate::jail::testing
