// A JailSpec's JSON form (the launcher's --spec file, a zygote request): it round-trips, refuses
// what the jail must not be given with the message the operator sees, and never throws.
#include "cellgate/launcher/spec_json.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace cellgate::launcher {
namespace {

using nlohmann::json;

TEST(SpecJson, EveryFieldRoundTrips) {
  jail::JailSpec spec;
  spec.memory_bytes = 512ull << 20;
  spec.pids = 64;
  spec.cpus = 0.5;
  spec.time_limit_seconds = 2.5;
  spec.uid = 1234567;
  spec.gid = 7654321;
  spec.hostname = "h";
  spec.name = "k1";
  spec.work_dir = "/var/lib/cellgate/k1/work";
  spec.binds = {{"/usr/local/bin/probe", "/opt/probe", true}};
  spec.etc_binds = {"ssl"};
  spec.system_binds = {"/opt/cache"};
  spec.env = {{"A", "1"}};
  spec.optional = {"swap"};
  spec.loopback_network = true;
  const json j = spec_to_json(spec);
  auto back = spec_from_json(json::parse(j.dump()));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(spec_to_json(*back), j);
  EXPECT_EQ(back->uid, spec.uid);
  EXPECT_TRUE(back->loopback_network);
  ASSERT_EQ(back->binds.size(), 1u);
  EXPECT_TRUE(back->binds[0].writable);
}

TEST(SpecJson, AbsentKeysKeepTheDefaults) {
  auto spec = spec_from_json(json::object());
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec_to_json(*spec), spec_to_json(jail::JailSpec{}));
  EXPECT_FALSE(spec_to_json(*spec).contains("uid"));  // the launcher picks one per kernel
  EXPECT_FALSE(spec->loopback_network);               // no network unless asked for
}

TEST(SpecJson, RefusalsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"[]", "the jail spec is not a JSON object"},
      {R"({"memroy_bytes": 1})", "unknown key 'memroy_bytes'"},
      {R"({"pids": "x"})", "a field has the wrong type: "},
      {R"({"loopback_network": 1})", "a field has the wrong type: "},
      {R"({"binds": [{"target": "/opt/p"}]})", "a field has the wrong type: "},
      {R"({"memory_bytes": 1000})", "limits must be positive (memory at least 16 MiB)"},
      {R"({"uid": 0})", "the kernel's uid must not be 0"},
      {R"({"gid": 0})", "the kernel's gid must not be 0"},
      {R"({"optional": ["gpu"]})", "unknown optional limit 'gpu'"},
      {R"({"cgroup_group": "../escape"})", "cgroup_group must be a plain name"},
      {R"({"name": "a/b"})", "name must be a plain name"},
      {R"({"binds": [{"source": "/a", "target": "/x/../y"}]})", "an absolute target without '..'"},
      {R"({"etc_binds": ["shadow"]})", "/etc/shadow is never bound into a jail"},
      {R"({"etc_binds": ["a/b"]})", "etc_binds are names directly under /etc"},
      {R"({"system_binds": ["var/cache"]})", "system_binds are absolute paths below /"},
      {R"({"system_binds": ["/var/../etc"]})", "without '', '.' or '..' parts"},
      {R"({"system_binds": ["/etc/R"]})", "may not reach into /etc ('/etc/R'); name /etc"},
      {R"({"system_binds": ["/root/.ssh"]})", "may not reach into /root"},
  };
  for (const auto& [text, message] : cases) {
    auto spec = spec_from_json(json::parse(text));
    ASSERT_FALSE(spec) << text;
    EXPECT_EQ(spec.error().code, ErrorCode::kInvalidArgument) << text;
    EXPECT_EQ(spec.error().reason, "bad_jail_spec") << text;
    EXPECT_NE(spec.error().message.find(message), std::string::npos)
        << text << ": " << spec.error().message;
  }
}

TEST(SpecJson, LoadReportsAMissingFileAndBadJson) {
  auto missing = load_spec("/nonexistent/cellgate/spec.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);

  char path[] = "/tmp/cellgate-spec-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << "{nope";
  auto garbled = load_spec(path);
  ASSERT_FALSE(garbled);
  EXPECT_EQ(garbled.error().message, std::string(path) + " is not valid JSON");

  std::ofstream(path) << R"({"pids": 8})";
  auto loaded = load_spec(path);
  ::unlink(path);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->pids, 8);
}

}  // namespace
}  // namespace cellgate::launcher
