// Unit tests of the artifact store (cellgate/server/artifacts.hpp): decoding what Jupyter sends,
// content addressing and dedupe on disk, the per-kernel caps, locate() with and without the
// records in memory, and concurrent puts. Each test works in its own mkdtemp directory.
#include "cellgate/store/artifacts.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::store {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A valid 1x1 RGBA PNG (IHDR, IDAT, IEND with correct CRCs), 70 bytes decoded.
constexpr const char* kPngBase64 =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg"
    "==";
// sha256sum of those 70 bytes, computed outside cellgate.
constexpr const char* kPngSha = "497790947d4666760ce38f3c00e852c71fdb66cae849bae8e9ede352719e1581";
constexpr std::string_view kPngSignature = "\x89PNG\r\n\x1a\n";

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cellgate_artifacts_XXXXXX").string();
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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Content files in the store: everything but the index journal.
std::set<std::string> content_files(const std::string& dir) {
  std::set<std::string> names;
  if (!fs::exists(dir)) {
    return names;
  }
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().parent_path().filename() != "index") {
      names.insert(entry.path().filename().string());
    }
  }
  return names;
}

// locate()'s mime, or the error, so that a failure reads as a failed expectation.
std::string mime_of(const ArtifactStore& store, const std::string& sha) {
  auto where = store.locate(sha);
  return where.ok() ? where->second : "error " + where.error().describe();
}

std::string svg(int n) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>" + std::to_string(n) + "</text></svg>";
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63],
            kAlphabet[v & 63]};
  }
  if (i + 1 == bytes.size()) {
    const unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

TEST(ArtifactStoreTest, Sha256HexMatchesKnownVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ArtifactStoreTest, ArtifactMimes) {
  for (const char* mime :
       {"image/png", "image/jpeg", "image/gif", "image/svg+xml", "application/pdf"}) {
    EXPECT_TRUE(ArtifactStore::is_artifact_mime(mime)) << mime;
  }
  for (const char* mime : {"text/plain", "text/html", "image/PNG", "image/png ", ""}) {
    EXPECT_FALSE(ArtifactStore::is_artifact_mime(mime)) << mime;
  }
}

TEST(ArtifactStoreTest, PngRoundTrip) {
  TempDir tmp;
  ArtifactStore store(tmp.path() + "/artifacts");
  auto rec = store.put("k1", 3, "image/png", kPngBase64);
  ASSERT_TRUE(rec.ok()) << rec.error().describe();
  EXPECT_EQ(rec->kind, "display");
  EXPECT_EQ(rec->sha256, kPngSha);
  EXPECT_EQ(rec->mime_type, "image/png");
  EXPECT_EQ(rec->size, 70u);
  EXPECT_EQ(rec->kernel_id, "k1");
  EXPECT_EQ(rec->execution_count, 3);
  EXPECT_EQ(rec->created.size(), 27u) << rec->created;  // 2026-01-02T03:04:05.123456Z
  EXPECT_EQ(rec->created.back(), 'Z');

  auto where = store.locate(kPngSha);
  ASSERT_TRUE(where.ok()) << where.error().describe();
  EXPECT_EQ(where->first, tmp.path() + "/artifacts/49/" + kPngSha);
  EXPECT_EQ(where->second, "image/png");
  const std::string bytes = read_file(where->first);
  EXPECT_EQ(bytes.size(), 70u);
  EXPECT_EQ(std::string_view(bytes).substr(0, 8), kPngSignature);
  EXPECT_EQ(sha256_hex(bytes), kPngSha);

  struct stat st {};
  ASSERT_EQ(::stat(where->first.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((tmp.path() + "/artifacts/49").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  const json j = rec->to_json();
  EXPECT_EQ(j["kind"], "display");
  EXPECT_EQ(j["sha256"], kPngSha);
  EXPECT_EQ(j["mime_type"], "image/png");
  EXPECT_EQ(j["size"], 70);
  EXPECT_EQ(j["execution_count"], 3);
  EXPECT_FALSE(j.contains("path"));
}

TEST(ArtifactStoreTest, Base64WithLineBreaksAndAsLines) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  std::string wrapped;
  const std::string plain = kPngBase64;
  for (std::size_t i = 0; i < plain.size(); i += 20) {
    wrapped += plain.substr(i, 20) + "\r\n";
  }
  auto a = store.put("k1", 1, "image/png", wrapped);
  ASSERT_TRUE(a.ok()) << a.error().describe();
  EXPECT_EQ(a->sha256, kPngSha);
  auto b =
      store.put("k1", 2, "image/png", json::array({plain.substr(0, 40) + "\n", plain.substr(40)}));
  ASSERT_TRUE(b.ok()) << b.error().describe();
  EXPECT_EQ(b->sha256, kPngSha);
}

TEST(ArtifactStoreTest, SameContentIsStoredOnce) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  ASSERT_TRUE(store.put("k1", 1, "image/png", kPngBase64).ok());
  const std::string file = tmp.path() + "/49/" + kPngSha;
  struct stat first {};
  ASSERT_EQ(::stat(file.c_str(), &first), 0);
  ASSERT_TRUE(store.put("k1", 2, "image/png", kPngBase64).ok());
  ASSERT_TRUE(store.put("k2", 1, "image/png", kPngBase64).ok());
  EXPECT_EQ(content_files(tmp.path()), std::set<std::string>{kPngSha});
  // Not written again (a rewrite would rename a new inode into place).
  struct stat now {};
  ASSERT_EQ(::stat(file.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, first.st_ino);
  // Unless what is there was cut short (a crash before the data reached the disk).
  fs::resize_file(file, 10);
  ASSERT_TRUE(store.put("k1", 3, "image/png", kPngBase64).ok());
  EXPECT_EQ(sha256_hex(read_file(file)), kPngSha);

  // Each display is recorded, with its own execution_count.
  const auto k1 = store.list("k1");
  ASSERT_EQ(k1.size(), 3u);
  EXPECT_EQ(k1[0].execution_count, 1);
  EXPECT_EQ(k1[1].execution_count, 2);
  EXPECT_EQ(store.list("k2").size(), 1u);
  EXPECT_TRUE(store.list("nobody").empty());

  // And journalled, one JSON line each.
  std::istringstream journal(read_file(tmp.path() + "/index/k1.jsonl"));
  std::vector<json> lines;
  for (std::string line; std::getline(journal, line);) {
    lines.push_back(json::parse(line));
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["sha256"], kPngSha);
  EXPECT_EQ(lines[1]["execution_count"], 2);
}

TEST(ArtifactStoreTest, CountCapStoresNothing) {
  TempDir tmp;
  ArtifactStore store(tmp.path(), ArtifactCaps{.count = 2});
  ASSERT_TRUE(store.put("k1", 1, "image/svg+xml", svg(1)).ok());
  ASSERT_TRUE(store.put("k1", 2, "image/svg+xml", svg(2)).ok());
  auto third = store.put("k1", 3, "image/svg+xml", svg(3));
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(third.error().reason, "artifact_cap");
  EXPECT_NE(third.error().message.find("cap of 2 artifacts"), std::string::npos)
      << third.error().message;
  EXPECT_EQ(content_files(tmp.path()).count(sha256_hex(svg(3))), 0u);
  EXPECT_EQ(store.list("k1").size(), 2u);
  auto file = store.record_file("k1", 3, "out.csv", 10);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().reason, "artifact_cap");

  // Per kernel: another kernel is not affected; forget() frees the kernel's allowance.
  EXPECT_TRUE(store.put("k2", 1, "image/svg+xml", svg(3)).ok());
  store.forget("k1");
  EXPECT_TRUE(store.list("k1").empty());
  EXPECT_TRUE(store.put("k1", 4, "image/svg+xml", svg(4)).ok());
}

TEST(ArtifactStoreTest, BytesCapCountsDistinctContentOnce) {
  TempDir tmp;
  ArtifactStore store(tmp.path(), ArtifactCaps{.bytes = 100});
  ASSERT_TRUE(store.put("k1", 1, "image/png", kPngBase64).ok());  // 70 bytes
  ASSERT_TRUE(store.put("k1", 2, "image/png", kPngBase64).ok());  // the same 70, not counted
  const std::string big(40, 'x');                                 // 70 + 40 > 100
  auto over = store.put("k1", 3, "image/svg+xml", "<svg>" + big + "</svg>");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().reason, "artifact_cap");
  EXPECT_NE(over.error().message.find("100 bytes"), std::string::npos) << over.error().message;
  EXPECT_EQ(content_files(tmp.path()), std::set<std::string>{kPngSha});
  EXPECT_EQ(store.list("k1").size(), 2u);
  // A file record is not content and costs no bytes.
  EXPECT_TRUE(store.record_file("k1", 3, "big.bin", 1u << 30).ok());
  // What fits still goes in.
  EXPECT_TRUE(store.put("k1", 4, "image/svg+xml", "<svg>12</svg>").ok());
}

TEST(ArtifactStoreTest, OneArtifactSizeCap) {
  TempDir tmp;
  ArtifactStore store(tmp.path(), ArtifactCaps{.max_artifact_bytes = 69});
  auto rec = store.put("k1", 1, "image/png", kPngBase64);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(rec.error().reason, "artifact_cap");
  EXPECT_NE(rec.error().message.find("for one artifact"), std::string::npos);
  EXPECT_TRUE(content_files(tmp.path()).empty());
  EXPECT_TRUE(store.list("k1").empty());
}

TEST(ArtifactStoreTest, RejectsBadValues) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  const std::string png = kPngBase64;
  struct Case {
    json value;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"not base64!", "bad_base64"},
      {png.substr(0, png.size() - 1), "bad_base64"},  // length not a multiple of 4
      {"iVBO R0KG", "bad_base64"},                    // spaces are not line breaks
      {"ab=c", "bad_base64"},                         // data inside the padding
      {"a===", "bad_base64"},                         // too much padding
      {"====", "bad_base64"},
      {"YQ==YWJj", "bad_base64"},  // data after the padding
      {"YWJj\x01", "bad_base64"},
      {"", "bad_artifact"},  // decodes to nothing
      {42, "bad_artifact"},
      {json::object(), "bad_artifact"},
      {json::array({"iVBO", 7}), "bad_artifact"},
  };
  for (const auto& c : cases) {
    auto rec = store.put("k1", 1, "image/png", c.value);
    ASSERT_FALSE(rec.ok()) << c.value.dump();
    EXPECT_EQ(rec.error().code, ErrorCode::kInvalidArgument) << c.value.dump();
    EXPECT_EQ(rec.error().reason, c.reason) << c.value.dump() << ": " << rec.error().message;
  }
  EXPECT_EQ(store.put("k1", 1, "text/html", "<b>x</b>").error().reason, "unsupported_mime");
  EXPECT_EQ(store.put("../k", 1, "image/png", kPngBase64).error().reason, "bad_kernel_id");
  EXPECT_EQ(store.put("", 1, "image/png", kPngBase64).error().reason, "bad_kernel_id");
  EXPECT_TRUE(content_files(tmp.path()).empty());
  EXPECT_TRUE(store.list("k1").empty());
  // The padded forms that are valid do decode: "YQ==" is "a", "YWI=" is "ab".
  auto a = store.put("k1", 1, "image/gif", "YQ==");
  ASSERT_TRUE(a.ok()) << a.error().describe();
  EXPECT_EQ(a->sha256, sha256_hex("a"));
  auto ab = store.put("k1", 1, "image/gif", "YWI=");
  ASSERT_TRUE(ab.ok()) << ab.error().describe();
  EXPECT_EQ(ab->sha256, sha256_hex("ab"));
}

TEST(ArtifactStoreTest, SvgAsTextAndAsLines) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  const std::string text = "<svg xmlns=\"http://www.w3.org/2000/svg\">\n  <text>é</text>\n</svg>\n";
  auto one = store.put("k1", 1, "image/svg+xml", text);
  ASSERT_TRUE(one.ok()) << one.error().describe();
  EXPECT_EQ(one->sha256, sha256_hex(text));
  EXPECT_EQ(one->size, text.size());
  auto lines = store.put("k1", 2, "image/svg+xml",
                         json::array({"<svg xmlns=\"http://www.w3.org/2000/svg\">\n",
                                      "  <text>é</text>\n", "</svg>\n"}));
  ASSERT_TRUE(lines.ok()) << lines.error().describe();
  EXPECT_EQ(lines->sha256, one->sha256);
  auto where = store.locate(one->sha256);
  ASSERT_TRUE(where.ok());
  EXPECT_EQ(read_file(where->first), text);
  EXPECT_EQ(where->second, "image/svg+xml");
}

TEST(ArtifactStoreTest, LocateRejectsMalformedIds) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  ASSERT_TRUE(store.put("k1", 1, "image/png", kPngBase64).ok());
  const std::string upper = "497790947D4666760CE38F3C00E852C71FDB66CAE849BAE8E9EDE352719E1581";
  for (const std::string& bad :
       {std::string("../etc/passwd"), std::string("../../../../../../../../etc/passwd"),
        std::string(kPngSha).substr(0, 63), std::string(kPngSha) + "0", upper,
        "49/" + std::string(kPngSha).substr(3), std::string(), std::string(64, '.')}) {
    auto where = store.locate(bad);
    ASSERT_FALSE(where.ok()) << bad;
    EXPECT_EQ(where.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(where.error().reason, "bad_sha") << bad;
  }
  auto absent = store.locate(std::string(64, '0'));
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.error().code, ErrorCode::kNotFound);
}

TEST(ArtifactStoreTest, MimeFromMemoryThenSniffedAfterRestart) {
  TempDir tmp;
  const std::string jpeg = std::string("\xff\xd8\xff\xe0", 4) + "JFIF-ish";
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  const std::string pdf = "%PDF-1.4\n%%EOF\n";
  const std::string svg_text = "\xef\xbb\xbf  <?xml version=\"1.0\"?><svg/>";
  std::string png_sha;
  {
    ArtifactStore store(tmp.path());
    ASSERT_TRUE(store.put("k1", 1, "image/jpeg", base64(jpeg)).ok());
    ASSERT_TRUE(store.put("k1", 2, "image/gif", base64(gif)).ok());
    ASSERT_TRUE(store.put("k1", 3, "application/pdf", base64(pdf)).ok());
    ASSERT_TRUE(store.put("k1", 4, "image/svg+xml", svg_text).ok());
    // The kernel said jpeg; while the record is in memory, that is what locate says.
    auto mislabelled = store.put("k1", 5, "image/jpeg", kPngBase64);
    ASSERT_TRUE(mislabelled.ok());
    png_sha = mislabelled->sha256;
    EXPECT_EQ(mime_of(store, png_sha), "image/jpeg");
  }
  ArtifactStore restarted(tmp.path());
  EXPECT_EQ(mime_of(restarted, png_sha), "image/png");
  EXPECT_EQ(mime_of(restarted, sha256_hex(jpeg)), "image/jpeg");
  EXPECT_EQ(mime_of(restarted, sha256_hex(gif)), "image/gif");
  EXPECT_EQ(mime_of(restarted, sha256_hex(pdf)), "application/pdf");
  EXPECT_EQ(mime_of(restarted, sha256_hex(svg_text)), "image/svg+xml");

  // Content of no known kind.
  const std::string other = "just bytes";
  const std::string sha = sha256_hex(other);
  fs::create_directories(tmp.path() + "/" + sha.substr(0, 2));
  std::ofstream(tmp.path() + "/" + sha.substr(0, 2) + "/" + sha) << other;
  EXPECT_EQ(mime_of(restarted, sha), "application/octet-stream");
}

TEST(ArtifactStoreTest, ForgetKeepsContent) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  ASSERT_TRUE(store.put("k1", 1, "image/png", kPngBase64).ok());
  store.forget("k1");
  EXPECT_TRUE(store.list("k1").empty());
  auto where = store.locate(kPngSha);
  ASSERT_TRUE(where.ok());
  EXPECT_EQ(where->second, "image/png");  // sniffed now
}

TEST(ArtifactStoreTest, RecordsFiles) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  auto rec = store.record_file("k1", nullptr, "plots/out.csv", 1234);
  ASSERT_TRUE(rec.ok()) << rec.error().describe();
  const json j = rec->to_json();
  EXPECT_EQ(j["kind"], "file");
  EXPECT_EQ(j["path"], "plots/out.csv");
  EXPECT_EQ(j["size"], 1234);
  EXPECT_TRUE(j["execution_count"].is_null());
  EXPECT_FALSE(j.contains("sha256"));
  ASSERT_EQ(store.list("k1").size(), 1u);
  EXPECT_EQ(store.list("k1")[0].path, "plots/out.csv");
  EXPECT_EQ(store.record_file("a/b", 1, "x", 1).error().reason, "bad_kernel_id");
}

TEST(ArtifactStoreTest, ConcurrentPuts) {
  TempDir tmp;
  ArtifactStore store(tmp.path());
  constexpr int kThreads = 8;
  constexpr int kPuts = 40;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string kernel = "k" + std::to_string(t % 2);
      for (int i = 0; i < kPuts; ++i) {
        // Half the content is shared by every thread, half is the thread's own.
        const int n = i % 2 == 0 ? i : 1000 * (t + 1) + i;
        if (!store.put(kernel, i, "image/svg+xml", svg(n)).ok()) {
          ++failures[static_cast<std::size_t>(t)];
        }
        if (!store.put(kernel, i, "image/png", kPngBase64).ok()) {
          ++failures[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (int f : failures) {
    EXPECT_EQ(f, 0);
  }
  EXPECT_EQ(store.list("k0").size(), static_cast<std::size_t>(kThreads / 2 * kPuts * 2));
  EXPECT_EQ(store.list("k1").size(), static_cast<std::size_t>(kThreads / 2 * kPuts * 2));
  // 20 shared svgs + 20 own per thread + the png; no temp files left behind.
  const auto files = content_files(tmp.path());
  EXPECT_EQ(files.size(), static_cast<std::size_t>(kPuts / 2 + kThreads * kPuts / 2 + 1));
  for (const auto& name : files) {
    EXPECT_EQ(name.size(), 64u) << name;
  }
}

}  // namespace
}  // namespace cellgate::store
