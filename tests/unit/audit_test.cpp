// Unit tests of the audit log (cellgate/server/audit.hpp): one JSON line per record, the default
// and custom redaction patterns, long strings, rotation, and the errors create() reports. Each
// test writes into its own mkdtemp directory.
#include "cellgate/store/audit.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::store {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cellgate_audit_XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) {
      path_ = pattern;
    }
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(json::parse(line));  // throws, failing the test, on a line that is not JSON
  }
  return lines;
}

std::unique_ptr<AuditLog> make_log(AuditOptions options) {
  auto log = AuditLog::create(std::move(options));
  EXPECT_TRUE(log.ok()) << log.error().describe();
  return log.ok() ? std::move(log).value() : nullptr;
}

TEST(AuditLogTest, OneJsonLinePerRecord) {
  TempDir tmp;
  const std::string path = tmp.path() + "/logs/audit/audit.jsonl";
  auto log = make_log({.path = path});
  ASSERT_TRUE(log);
  EXPECT_TRUE(log->enabled());
  EXPECT_FALSE(fs::exists(path));  // nothing opened before the first write
  log->write({{"kernel_id", "k1"}, {"n", 1}, {"code", "print('a\\nb')\nx = 1"}});
  log->write({{"kernel_id", "k1"}, {"n", 2}, {"nested", {{"list", {1, "two", nullptr}}}}});
  log->write({{"kernel_id", "k2"}, {"n", 3}, {"bytes", "\xff\xfe not utf-8"}});

  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["code"], "print('a\\nb')\nx = 1");
  EXPECT_EQ(lines[1]["nested"]["list"][1], "two");
  EXPECT_EQ(lines[2]["n"], 3);

  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((tmp.path() + "/logs/audit").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(AuditLogTest, DefaultPatternsRedact) {
  auto log = make_log({});
  ASSERT_TRUE(log);
  EXPECT_FALSE(log->enabled());
  const std::string pem_body = "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi\nZ1BjP5CE/Wm/Rr500P\n";
  struct Case {
    std::string input;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"aws = 'AKIAIOSFODNN7EXAMPLE'", "aws = '[REDACTED]'"},
      {"ASIAY34FZKBOKMUTVV7A in use", "[REDACTED] in use"},
      {"api_key=abc123def", "api_key=[REDACTED]"},
      {"API-KEY: abc123def", "API-KEY: [REDACTED]"},
      {"export GITHUB_TOKEN=xyz987 && run", "export GITHUB_TOKEN=[REDACTED] && run"},
      {"AWS_SECRET_ACCESS_KEY = wJalrXUtnFEMI/K7MDENG", "AWS_SECRET_ACCESS_KEY = [REDACTED]"},
      {"db(password=\"correct horse\", user=1)", "db(password=[REDACTED], user=1)"},
      {"{\"passwd\": 'hunter two'}", "{\"passwd\": [REDACTED]}"},
      {"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "Authorization: [REDACTED]"},
      {"headers = {'Authorization': 'Basic dXNlcjpwYXNz'}",
       "headers = {'Authorization': [REDACTED]}"},
      {"curl -H 'X: bearer abc.DEF-123_~+/=='", "curl -H 'X: bearer [REDACTED]'"},
      {"t = 'ghp_" + std::string(36, 'a') + "'", "t = '[REDACTED]'"},
      {"gho_" + std::string(40, 'Z') + " x", "[REDACTED] x"},
      {"github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "[REDACTED]"},
      {"openai.api_base; key sk-abcdefghijklmnopqrstuvwx1234", "openai.api_base; key [REDACTED]"},
      {"sk-proj-abcdefghij_klmnopqrstu-vwx", "[REDACTED]"},
      {"a\n-----BEGIN RSA PRIVATE KEY-----\n" + pem_body + "-----END RSA PRIVATE KEY-----\nb",
       "a\n[REDACTED]\nb"},
      {"-----BEGIN PRIVATE KEY-----\n" + pem_body + "-----END PRIVATE KEY-----", "[REDACTED]"},
      // Two keys: each block on its own, the text between kept (the body is matched lazily).
      {"-----BEGIN EC PRIVATE KEY-----\nA\n-----END EC PRIVATE KEY-----\nkeep\n"
       "-----BEGIN OPENSSH PRIVATE KEY-----\nB\n-----END OPENSSH PRIVATE KEY-----",
       "[REDACTED]\nkeep\n[REDACTED]"},
      // A key with no END line (a cut string) goes to the end.
      {"x\n-----BEGIN RSA PRIVATE KEY-----\n" + pem_body, "x\n[REDACTED]"},
      // Left alone.
      {"print(1 + 1)", "print(1 + 1)"},
      {"tokenizer = AutoTokenizer(); generate(max_tokens=100)",
       "tokenizer = AutoTokenizer(); generate(max_tokens=100)"},
      {"AKIA-not-a-key, ghp_short, sk-short, task-abcdefghijklmnopqrstuvwxyz",
       "AKIA-not-a-key, ghp_short, sk-short, task-abcdefghijklmnopqrstuvwxyz"},
      {"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
       "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(log->redact(c.input), c.expected) << c.input;
  }
}

TEST(AuditLogTest, WriteRedactsValuesAtAnyDepthAndKeepsKeys) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto log = make_log({.path = path});
  ASSERT_TRUE(log);
  log->write(
      {{"code", "token = 'abc'\nprint(1)"},
       {"AKIAIOSFODNN7EXAMPLE", "the key itself is kept"},
       {"outputs", {{{"text", "ghp_" + std::string(36, 'q')}}, "sk-" + std::string(30, 'w')}},
       {"count", 5}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const json& line = lines[0];
  EXPECT_EQ(line["code"], "token = [REDACTED]\nprint(1)");
  EXPECT_EQ(line["AKIAIOSFODNN7EXAMPLE"], "the key itself is kept");
  EXPECT_EQ(line["outputs"][0]["text"], "[REDACTED]");
  EXPECT_EQ(line["outputs"][1], "[REDACTED]");
  EXPECT_EQ(line["count"], 5);
}

TEST(AuditLogTest, LongStrings) {
  // libstdc++'s default (depth-first) regex executor overflows an 8 MiB stack on a match of
  // about 100 KB.
  auto unlimited = make_log({.path = "", .max_string_bytes = 0});
  ASSERT_TRUE(unlimited);
  const std::string huge(300'000, 'a');
  EXPECT_EQ(unlimited->redact("token=" + huge + " rest"), "token=[REDACTED] rest");
  EXPECT_EQ(unlimited->redact("-----BEGIN RSA PRIVATE KEY-----\n" + huge), "[REDACTED]");
  EXPECT_EQ(unlimited->redact(huge).size(), huge.size());

  // Cut at the last whitespace before the limit: the secret straddling it goes whole.
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto capped = make_log({.path = path, .max_string_bytes = 100});
  ASSERT_TRUE(capped);
  const std::string text = std::string(90, 'x') + " AKIAIOSFODNN7EXAMPLE " + std::string(500, 'y');
  capped->write({{"code", text}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const std::string code = lines[0]["code"];
  EXPECT_EQ(code, std::string(90, 'x') + " ...[truncated " + std::to_string(text.size() - 91) +
                      " bytes]");
}

TEST(AuditLogTest, CustomPatterns) {
  auto log = make_log({.path = "", .redact = {"internal-[0-9]+", "(?i)codename", "(user=)\\w+"}});
  ASSERT_TRUE(log);
  EXPECT_EQ(log->redact("see internal-42 and internal-7"), "see [REDACTED] and [REDACTED]");
  EXPECT_EQ(log->redact("CodeName Falcon"), "[REDACTED] Falcon");
  EXPECT_EQ(log->redact("user=alice;"), "user=[REDACTED];");
  // Where a pattern can match nothing (at a word boundary here), nothing is replaced.
  auto boundary = make_log({.path = "", .redact = {"\\bx?"}});
  ASSERT_TRUE(boundary);
  EXPECT_EQ(boundary->redact("ab x"), "ab [REDACTED]");
  // Replacing the defaults means the defaults are gone.
  EXPECT_EQ(log->redact("AKIAIOSFODNN7EXAMPLE"), "AKIAIOSFODNN7EXAMPLE");

  AuditOptions more;
  more.redact.push_back("internal-[0-9]+");
  auto both = make_log(more);
  ASSERT_TRUE(both);
  EXPECT_EQ(both->redact("AKIAIOSFODNN7EXAMPLE internal-1"), "[REDACTED] [REDACTED]");
}

// A custom pattern is tried at every position. libstdc++'s std::regex searched from each one to
// the end of the text (quadratic: hours on this MiB); RE2 is one pass.
TEST(AuditLogTest, CustomPatternsAreLinearInTheText) {
  auto log = make_log({.path = "", .redact = {"[a-z]+y", "(?i)(x=)[0-9]+"}, .max_string_bytes = 0});
  ASSERT_TRUE(log);
  const std::string huge(1u << 20, 'a');
  EXPECT_EQ(log->redact(huge), huge);
  EXPECT_EQ(log->redact(huge + "y"), "[REDACTED]");
  EXPECT_EQ(log->redact("X=" + std::string(1u << 20, '7') + " z"), "X=[REDACTED] z");
  // Bytes that are not UTF-8 are matched as they are.
  EXPECT_EQ(log->redact("\xff\xfe abcy \xff"), "\xff\xfe [REDACTED] \xff");
}

// A record whose values nest deep (what a kernel sent, put in a record) is walked without
// recursion.
TEST(AuditLogTest, DeepRecordsAreRedacted) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto log = make_log({.path = path});
  ASSERT_TRUE(log);
  json deep = "token=abc";
  for (int i = 0; i < 500; ++i) {
    deep = json::array({deep});
  }
  log->write({{"deep", deep}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const json* v = &lines[0]["deep"];
  while (v->is_array()) {
    v = &(*v)[0];
  }
  EXPECT_EQ(*v, "token=[REDACTED]");
}

TEST(AuditLogTest, InvalidPatternsAreErrors) {
  for (const char* bad : {"([a-z", "a{2,1}", "*x", "a*", "x|", "(a)\\1"}) {
    auto log = AuditLog::create({.path = "", .redact = {"fine", bad}});
    ASSERT_FALSE(log.ok()) << bad;
    EXPECT_EQ(log.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(log.error().reason, "bad_redact_pattern") << bad;
    EXPECT_NE(log.error().message.find(bad), std::string::npos) << log.error().message;
  }
}

TEST(AuditLogTest, RotationKeepsAtMostKeepFiles) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto log = make_log({.path = path, .max_bytes = 200, .keep = 2});
  ASSERT_TRUE(log);
  for (int i = 0; i < 50; ++i) {
    log->write({{"seq", i}, {"pad", std::string(30, 'p')}});  // ~45 bytes a line
  }
  ASSERT_TRUE(fs::exists(path));
  ASSERT_TRUE(fs::exists(path + ".1"));
  ASSERT_TRUE(fs::exists(path + ".2"));
  EXPECT_FALSE(fs::exists(path + ".3"));
  std::vector<int> seqs;
  for (const std::string& file : {path + ".2", path + ".1", path}) {
    EXPECT_LE(fs::file_size(file), 200u) << file;
    for (const json& line : read_lines(file)) {
      seqs.push_back(line["seq"]);
    }
  }
  // Oldest to newest without a gap, ending with the last record in `path`.
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.back(), 49);
  for (std::size_t i = 1; i < seqs.size(); ++i) {
    EXPECT_EQ(seqs[i], seqs[i - 1] + 1);
  }
  EXPECT_GT(seqs.size(), 8u);  // three files' worth
}

TEST(AuditLogTest, RotationWithKeepZeroAndOversizedRecords) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto log = make_log({.path = path, .max_bytes = 100, .keep = 0});
  ASSERT_TRUE(log);
  log->write({{"seq", 1}});
  log->write({{"seq", 2}, {"big", std::string(300, 'b')}});  // alone over max_bytes
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["seq"], 2);  // written whole, into a fresh file
  EXPECT_EQ(lines[0]["big"].get<std::string>().size(), 300u);
  EXPECT_FALSE(fs::exists(path + ".1"));
  log->write({{"seq", 3}});
  lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["seq"], 3);
}

TEST(AuditLogTest, ReopensAfterRestartAndAppends) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  make_log({.path = path})->write({{"seq", 1}});
  auto log = make_log({.path = path, .max_bytes = 1000});
  ASSERT_TRUE(log);
  log->write({{"seq", 2}});
  EXPECT_EQ(read_lines(path).size(), 2u);
}

TEST(AuditLogTest, IoFailuresDoNotThrow) {
  TempDir tmp;
  std::ofstream(tmp.path() + "/file") << "x";
  auto log = make_log({.path = tmp.path() + "/file/audit.jsonl"});
  ASSERT_TRUE(log);
  EXPECT_NO_THROW(log->write({{"seq", 1}}));
  EXPECT_NO_THROW(log->write({{"seq", 2}}));
  EXPECT_FALSE(fs::exists(tmp.path() + "/file/audit.jsonl"));
}

TEST(AuditLogTest, ConcurrentWritesKeepLinesWhole) {
  TempDir tmp;
  const std::string path = tmp.path() + "/audit.jsonl";
  auto log = make_log({.path = path});
  ASSERT_TRUE(log);
  constexpr int kThreads = 8;
  constexpr int kWrites = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites; ++i) {
        log->write({{"thread", t}, {"i", i}, {"code", "password=" + std::to_string(i)}});
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kThreads * kWrites));
  for (const json& line : lines) {
    EXPECT_EQ(line["code"], "password=[REDACTED]");
  }
}

}  // namespace
}  // namespace cellgate::store
