#include "cellgate/kernel/connection.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cellgate/util/text.hpp"

namespace cellgate::kernel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "cellgate-test-XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

json sample() {
  return json{{"shell_port", 5001},
              {"iopub_port", 5002},
              {"stdin_port", 5003},
              {"control_port", 5004},
              {"hb_port", 5005},
              {"ip", "127.0.0.1"},
              {"key", "abc"},
              {"transport", "tcp"},
              {"signature_scheme", "hmac-sha256"},
              {"kernel_name", "python3"}};
}

TEST(ConnectionInfo, TcpEndpoints) {
  auto info = ConnectionInfo::from_json(sample());
  ASSERT_TRUE(info) << info.error().describe();
  EXPECT_EQ(info->endpoint(Channel::kShell), "tcp://127.0.0.1:5001");
  EXPECT_EQ(info->endpoint(Channel::kHeartbeat), "tcp://127.0.0.1:5005");
  EXPECT_EQ(info->key, "abc");
}

TEST(ConnectionInfo, IpcEndpointsFollowJupyterClient) {
  auto j = sample();
  j["transport"] = "ipc";
  j["ip"] = "/run/k1/kernel";
  auto info = ConnectionInfo::from_json(j);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->endpoint(Channel::kIopub), "ipc:///run/k1/kernel-5002");
}

TEST(ConnectionInfo, RejectsBadFiles) {
  for (const char* key : {"shell_port", "ip"}) {
    auto j = sample();
    j.erase(key);
    auto info = ConnectionInfo::from_json(j);
    ASSERT_FALSE(info) << key;
    EXPECT_EQ(info.error().reason, "bad_connection_file");
  }
  auto j = sample();
  j["hb_port"] = 70000;
  EXPECT_FALSE(ConnectionInfo::from_json(j));
  j = sample();
  j["transport"] = "udp";
  EXPECT_FALSE(ConnectionInfo::from_json(j));
  j = sample();
  j["key"] = 12;
  EXPECT_FALSE(ConnectionInfo::from_json(j));
  EXPECT_FALSE(ConnectionInfo::from_json(json::array()));
}

TEST(ConnectionInfo, SaveIsOwnerOnlyAndLoadsBack) {
  TempDir dir;
  auto info = ConnectionInfo::make_ipc(dir.path() + "/k");
  EXPECT_EQ(info.key.size(), 64u);
  const std::string path = dir.path() + "/connection.json";
  ASSERT_TRUE(info.save(path));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto loaded = ConnectionInfo::load(path);
  ASSERT_TRUE(loaded) << loaded.error().describe();
  EXPECT_EQ(loaded->key, info.key);
  EXPECT_EQ(loaded->endpoint(Channel::kShell), info.endpoint(Channel::kShell));
  EXPECT_FALSE(ConnectionInfo::load(dir.path() + "/missing.json"));
}

TEST(ConnectionInfo, FreshKeysDiffer) {
  EXPECT_NE(ConnectionInfo::make_ipc("/a").key, ConnectionInfo::make_ipc("/a").key);
}

TEST(ConnectionInfo, TcpPortsAreDistinctAndNonZero) {
  auto info = ConnectionInfo::make_tcp();
  ASSERT_TRUE(info);
  std::set<int> ports = {info->shell_port, info->iopub_port, info->stdin_port, info->control_port,
                         info->hb_port};
  EXPECT_EQ(ports.size(), 5u);
  EXPECT_EQ(ports.count(0), 0u);
}

TEST(KernelSpec, LoadsAndExpandsArgv) {
  TempDir dir;
  std::ofstream(dir.path() + "/kernel.json")
      << R"({"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
             "display_name": "Python 3", "language": "python", "env": {"A": "1"}})";
  auto spec = KernelSpec::load(dir.path(), "py");
  ASSERT_TRUE(spec) << spec.error().describe();
  EXPECT_EQ(spec->display_name, "Python 3");
  auto argv = spec->expand_argv("/c.json");
  ASSERT_EQ(argv.size(), 5u);
  EXPECT_EQ(argv[4], "/c.json");
  EXPECT_EQ(spec->env["A"], "1");
}

TEST(KernelSpec, RejectsBadSpecs) {
  TempDir dir;
  std::ofstream(dir.path() + "/kernel.json") << R"({"argv": []})";
  auto spec = KernelSpec::load(dir.path(), "py");
  ASSERT_FALSE(spec);
  EXPECT_EQ(spec.error().reason, "bad_kernelspec");
  EXPECT_FALSE(find_kernelspec("../etc"));
  EXPECT_FALSE(find_kernelspec(""));
  auto missing = find_kernelspec("no-such-kernel-anywhere");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST(KernelSpec, JupyterPathComesFirst) {
  TempDir dir;
  fs::create_directories(dir.path() + "/kernels/python3");
  std::ofstream(dir.path() + "/kernels/python3/kernel.json")
      << R"({"argv": ["/opt/py", "{connection_file}"], "display_name": "Mine"})";
  ::setenv("JUPYTER_PATH", dir.path().c_str(), 1);
  auto spec = find_kernelspec("python3");
  ::unsetenv("JUPYTER_PATH");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->display_name, "Mine");
}

TEST(Text, StripAnsiRemovesColourCodes) {
  EXPECT_EQ(strip_ansi("\x1b[0;31mKeyError\x1b[0m: 'a'"), "KeyError: 'a'");
  EXPECT_EQ(strip_ansi("\x1b]0;title\x07plain"), "plain");
  EXPECT_EQ(strip_ansi("no codes"), "no codes");
  EXPECT_EQ(strip_ansi("trailing\x1b"), "trailing");
  EXPECT_EQ(strip_ansi("\x1b[38;5;12mblue\x1b[39m"), "blue");
}

}  // namespace
}  // namespace cellgate::kernel
