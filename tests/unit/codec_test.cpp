// Unit tests of the wire codec (cellgate/protocol/codec.hpp, message.hpp) against raw frames
// captured from a real ipykernel (tests/fixtures/ipykernel; tests/tools/capture_fixtures.py).
#include "cellgate/protocol/codec.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/protocol/message.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::protocol {
namespace {

using nlohmann::json;

// ---- helpers ---------------------------------------------------------------------------------

// Decodes standard base64 (with '=' padding). Fails the calling test on malformed input.
std::string base64_decode(std::string_view in) {
  auto bytes = cellgate::base64_decode(in);
  EXPECT_TRUE(bytes.ok()) << bytes.error().message;
  return bytes.ok() ? std::move(bytes).value() : std::string();
}

struct Fixture {
  std::string name;
  std::string key;
  std::string scheme;
  std::string channel;
  std::string msg_type;
  std::vector<std::string> frames;
};

// Every captured fixture, with the name of the request it answers: the capture script sends each
// request with msg_id "cellgate-fixture-<request>".
const std::map<std::string, std::string>& fixture_requests() {
  static const std::map<std::string, std::string> requests = {
      {"kernel_info_reply", "kernel_info"},
      {"status_busy", "stream"},
      {"stream", "stream"},
      {"execute_reply", "stream"},
      {"execute_result", "execute_result"},
      {"display_data", "display_data"},
      {"execute_reply_error", "error"},
      {"error", "error"},
      {"comm_open", "comm_open"},
  };
  return requests;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& [name, request] : fixture_requests()) {
    names.push_back(name);
  }
  return names;
}

Fixture load_fixture(const std::string& name) {
  Fixture fx;
  fx.name = name;
  const std::string path = std::string(CELLGATE_FIXTURES_DIR) + "/ipykernel/" + name + ".json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open fixture " << path;
    return fx;
  }
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    ADD_FAILURE() << "fixture " << path << " is not a JSON object";
    return fx;
  }
  fx.key = doc.value("key", "");
  fx.scheme = doc.value("signature_scheme", "");
  fx.channel = doc.value("channel", "");
  fx.msg_type = doc.value("msg_type", "");
  for (const auto& frame : doc.value("frames_b64", json::array())) {
    fx.frames.push_back(base64_decode(frame.get<std::string>()));
  }
  return fx;
}

Signer make_signer(const Fixture& fx) {
  auto signer = Signer::create(fx.scheme, fx.key);
  if (!signer) {
    ADD_FAILURE() << signer.error().describe();
    return Signer();
  }
  return std::move(signer).value();
}

std::vector<std::string_view> views(const std::vector<std::string>& frames) {
  return {frames.begin(), frames.end()};
}

std::size_t delimiter_index(const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (frames[i] == kDelimiter) {
      return i;
    }
  }
  ADD_FAILURE() << "no delimiter in frames";
  return 0;
}

// Index of the header, parent_header, metadata and content frames (0..3) and of the signature.
std::size_t json_frame_index(const std::vector<std::string>& frames, std::size_t which) {
  return delimiter_index(frames) + 2 + which;
}
std::size_t signature_index(const std::vector<std::string>& frames) {
  return delimiter_index(frames) + 1;
}

// Recomputes the signature frame so that the HMAC check passes whatever the JSON frames hold.
void resign(std::vector<std::string>& frames, const Signer& signer) {
  const std::size_t d = delimiter_index(frames);
  frames[d + 1] = signer.sign(frames[d + 2], frames[d + 3], frames[d + 4], frames[d + 5]);
}

// Matches s against a fixed-length pattern: 'h' is [0-9a-f], 'd' is [0-9], 'v' is [89ab], any
// other character stands for itself. (std::regex trips g++ 12's -Wmaybe-uninitialized.)
bool matches(std::string_view s, std::string_view pattern) {
  if (s.size() != pattern.size()) {
    return false;
  }
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool digit = c >= '0' && c <= '9';
    bool ok = false;
    switch (pattern[i]) {
      case 'h':
        ok = digit || (c >= 'a' && c <= 'f');
        break;
      case 'd':
        ok = digit;
        break;
      case 'v':
        ok = c == '8' || c == '9' || c == 'a' || c == 'b';
        break;
      default:
        ok = c == pattern[i];
        break;
    }
    if (!ok) {
      return false;
    }
  }
  return true;
}

// ^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$
bool is_uuid4(std::string_view s) {
  return matches(s, "hhhhhhhh-hhhh-4hhh-vhhh-hhhhhhhhhhhh");
}

// ^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{n}Z$ for some n in [min_digits, 6].
bool is_iso8601_utc(std::string_view s, std::size_t min_digits = 6) {
  for (std::size_t n = min_digits; n <= 6; ++n) {
    if (matches(s, "dddd-dd-ddTdd:dd:dd." + std::string(n, 'd') + "Z")) {
      return true;
    }
  }
  return false;
}

std::string reason_of(const Result<Message>& r) {
  return r ? "ok" : r.error().reason;
}

json frame_json(const Fixture& fx, std::size_t which) {
  return json::parse(fx.frames[json_frame_index(fx.frames, which)]);
}

Message decode_ok(const Fixture& fx) {
  auto msg = decode(fx.frames, make_signer(fx));
  if (!msg) {
    ADD_FAILURE() << fx.name << ": " << msg.error().describe();
    return {};
  }
  return std::move(msg).value();
}

// ---- every fixture ---------------------------------------------------------------------------

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, DecodesWithItsKey) {
  const Fixture fx = load_fixture(GetParam());
  ASSERT_FALSE(fx.frames.empty());
  EXPECT_EQ(fx.scheme, "hmac-sha256");
  auto msg = decode(fx.frames, make_signer(fx));
  ASSERT_TRUE(msg) << msg.error().describe();

  EXPECT_EQ(msg->msg_type(), fx.msg_type);
  const json header = frame_json(fx, 0);
  ASSERT_TRUE(header.contains("msg_id"));
  EXPECT_FALSE(msg->msg_id().empty());
  EXPECT_EQ(msg->msg_id(), header["msg_id"].get<std::string>());
  EXPECT_EQ(msg->header, header);
  EXPECT_EQ(msg->parent_header, frame_json(fx, 1));
  EXPECT_EQ(msg->metadata, frame_json(fx, 2));
  EXPECT_EQ(msg->content, frame_json(fx, 3));
  EXPECT_EQ(msg->parent_msg_id(), "cellgate-fixture-" + fixture_requests().at(fx.name));
  EXPECT_EQ(msg->header.value("version", ""), "5.3");

  // A DEALER sees no routing prefix on shell; a SUB sees the topic as one identity frame.
  if (fx.channel == "shell") {
    EXPECT_TRUE(msg->identities.empty());
  } else {
    ASSERT_EQ(fx.channel, "iopub");
    ASSERT_EQ(msg->identities.size(), 1u);
    EXPECT_EQ(msg->identities[0], fx.frames[0]);
  }
  if (fx.name != "comm_open") {
    EXPECT_TRUE(msg->buffers.empty());
  }
}

TEST_P(FixtureTest, SignerReproducesTheKernelsSignature) {
  const Fixture fx = load_fixture(GetParam());
  ASSERT_FALSE(fx.frames.empty());
  const std::size_t d = delimiter_index(fx.frames);
  EXPECT_EQ(
      make_signer(fx).sign(fx.frames[d + 2], fx.frames[d + 3], fx.frames[d + 4], fx.frames[d + 5]),
      fx.frames[d + 1]);
}

TEST_P(FixtureTest, ReencodeRoundTrips) {
  const Fixture fx = load_fixture(GetParam());
  const Signer signer = make_signer(fx);
  auto first = decode(fx.frames, signer);
  ASSERT_TRUE(first) << first.error().describe();
  const std::vector<std::string> frames = encode(*first, signer);
  auto second = decode(frames, signer);
  ASSERT_TRUE(second) << second.error().describe();
  EXPECT_EQ(second->identities, first->identities);
  EXPECT_EQ(second->header, first->header);
  EXPECT_EQ(second->parent_header, first->parent_header);
  EXPECT_EQ(second->metadata, first->metadata);
  EXPECT_EQ(second->content, first->content);
  EXPECT_EQ(second->buffers, first->buffers);
  // Same frame layout as the kernel's.
  EXPECT_EQ(frames.size(), fx.frames.size());
}

TEST_P(FixtureTest, PeekHeaderReadsTheHeaderFrameAlone) {
  const Fixture fx = load_fixture(GetParam());
  ASSERT_FALSE(fx.frames.empty());
  const std::string header_frame = fx.frames[json_frame_index(fx.frames, 0)];
  auto info = peek_header(header_frame);
  ASSERT_TRUE(info) << info.error().describe();
  const json header = json::parse(header_frame);
  EXPECT_EQ(info->msg_type, fx.msg_type);
  EXPECT_EQ(info->msg_id, header["msg_id"].get<std::string>());
  EXPECT_EQ(info->session, header["session"].get<std::string>());
  EXPECT_FALSE(info->session.empty());
}

TEST_P(FixtureTest, DecodeWithoutKeyAcceptsAnySignature) {
  Fixture fx = load_fixture(GetParam());
  ASSERT_FALSE(fx.frames.empty());
  fx.frames[signature_index(fx.frames)] = "not a signature";
  EXPECT_EQ(reason_of(decode(fx.frames, Signer())), "ok");
  EXPECT_EQ(reason_of(decode(fx.frames, make_signer(fx))), "bad_signature");
}

INSTANTIATE_TEST_SUITE_P(Ipykernel, FixtureTest, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

TEST(CodecFixtures, AllFixtureFilesArePresent) {
  for (const auto& name : fixture_names()) {
    const Fixture fx = load_fixture(name);
    EXPECT_GE(fx.frames.size(), 6u) << name;
    EXPECT_EQ(fx.msg_type.empty(), false) << name;
  }
}

// ---- content of particular fixtures -----------------------------------------------------------

TEST(CodecFixtures, KernelInfoReply) {
  const Message msg = decode_ok(load_fixture("kernel_info_reply"));
  EXPECT_EQ(msg.content.value("status", ""), "ok");
  EXPECT_EQ(msg.content.value("protocol_version", ""), "5.3");
  EXPECT_EQ(msg.content.value("implementation", ""), "ipython");
  ASSERT_TRUE(msg.content.contains("language_info"));
  EXPECT_EQ(msg.content["language_info"].value("name", ""), "python");
}

TEST(CodecFixtures, StatusBusy) {
  const Message msg = decode_ok(load_fixture("status_busy"));
  EXPECT_EQ(msg.content.value("execution_state", ""), "busy");
}

TEST(CodecFixtures, Stream) {
  const Message msg = decode_ok(load_fixture("stream"));
  EXPECT_EQ(msg.content.value("name", ""), "stdout");
  EXPECT_EQ(msg.content.value("text", ""), "hello from cellgate\n");
  ASSERT_EQ(msg.identities.size(), 1u);
  EXPECT_EQ(msg.identities[0], "stream.stdout");
}

TEST(CodecFixtures, ExecuteReplyOk) {
  const Message msg = decode_ok(load_fixture("execute_reply"));
  EXPECT_EQ(msg.content.value("status", ""), "ok");
  ASSERT_TRUE(msg.content.contains("execution_count"));
  EXPECT_TRUE(msg.content["execution_count"].is_number_integer());
  EXPECT_EQ(msg.metadata.value("status", ""), "ok");
}

TEST(CodecFixtures, ExecuteResult) {
  const Message msg = decode_ok(load_fixture("execute_result"));
  ASSERT_TRUE(msg.content.contains("data"));
  EXPECT_EQ(msg.content["data"].value("text/plain", ""), "3");
}

TEST(CodecFixtures, DisplayDataHasPng) {
  const Message msg = decode_ok(load_fixture("display_data"));
  ASSERT_TRUE(msg.content.contains("data"));
  const json& data = msg.content["data"];
  ASSERT_TRUE(data.contains("image/png"));
  ASSERT_TRUE(data["image/png"].is_string());
  std::string png_b64 = data["image/png"].get<std::string>();
  std::erase(png_b64, '\n');
  const std::string png = base64_decode(png_b64);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_TRUE(data.contains("text/plain"));
}

TEST(CodecFixtures, ExecuteReplyError) {
  const Message msg = decode_ok(load_fixture("execute_reply_error"));
  EXPECT_EQ(msg.content.value("status", ""), "error");
  EXPECT_EQ(msg.content.value("ename", ""), "ZeroDivisionError");
}

TEST(CodecFixtures, Error) {
  const Message msg = decode_ok(load_fixture("error"));
  EXPECT_EQ(msg.content.value("ename", ""), "ZeroDivisionError");
  ASSERT_TRUE(msg.content.contains("traceback"));
  EXPECT_TRUE(msg.content["traceback"].is_array());
  EXPECT_FALSE(msg.content["traceback"].empty());
}

TEST(CodecFixtures, CommOpenKeepsBinaryBuffers) {
  const Message msg = decode_ok(load_fixture("comm_open"));
  EXPECT_EQ(msg.content.value("target_name", ""), "cellgate.test");
  ASSERT_TRUE(msg.content.contains("data"));
  EXPECT_EQ(msg.content["data"].value("answer", 0), 42);
  const std::vector<std::string> expected = {std::string("\x00\x01\x02\xff", 4), "second buffer"};
  EXPECT_EQ(msg.buffers, expected);
}

// ---- encoding and signatures -----------------------------------------------------------------

TEST(Codec, EncodeThenSplitKeepsIdentitiesAndBuffers) {
  const Session session("tester", "session-1");
  Message msg = session.make("execute_request", {{"code", "1+1"}});
  msg.identities = {"peer-1", std::string("\x00\xffrouting", 9)};
  msg.buffers = {std::string("\x00\x00", 2), ""};
  const Signer signer = Signer::create("hmac-sha256", "secret").value();
  const std::vector<std::string> frames = encode(msg, signer);
  ASSERT_EQ(frames.size(), 2u + 6u + 2u);
  EXPECT_EQ(frames[2], kDelimiter);
  const std::vector<std::string_view> v = views(frames);
  auto raw_msg = split(v);
  ASSERT_TRUE(raw_msg) << raw_msg.error().describe();
  ASSERT_EQ(raw_msg->identities.size(), 2u);
  EXPECT_EQ(raw_msg->identities[0], msg.identities[0]);
  EXPECT_EQ(raw_msg->identities[1], msg.identities[1]);
  ASSERT_EQ(raw_msg->buffers.size(), 2u);
  EXPECT_EQ(raw_msg->buffers[0], msg.buffers[0]);
  EXPECT_EQ(raw_msg->buffers[1], msg.buffers[1]);
  EXPECT_TRUE(verify(*raw_msg, signer));
  auto parsed = parse(*raw_msg);
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(parsed->identities, msg.identities);
  EXPECT_EQ(parsed->content, msg.content);
}

TEST(Codec, SignatureIs64LowercaseHexForHmacSha256) {
  const Signer signer = Signer::create("hmac-sha256", "secret").value();
  EXPECT_TRUE(signer.enabled());
  const Message msg = Session().make("kernel_info_request", json::object());
  const std::vector<std::string> frames = encode(msg, signer);
  EXPECT_TRUE(matches(frames[signature_index(frames)], std::string(64, 'h')))
      << frames[signature_index(frames)];
  // Known answer: HMAC-SHA256("key", "{}{}{}{}"), as Python's hmac module computes it.
  const Signer known = Signer::create("hmac-sha256", "key").value();
  EXPECT_EQ(known.sign("{}", "{}", "{}", "{}"),
            "ca767b02c5bc061ed184a9a029e7f93a7f2f7ed4e8fe74120fc1212f0b008fa3");
  EXPECT_TRUE(known.verify("ca767b02c5bc061ed184a9a029e7f93a7f2f7ed4e8fe74120fc1212f0b008fa3", "{}",
                           "{}", "{}", "{}"));
}

TEST(Codec, EmptyKeyMeansNoSigning) {
  for (const Signer& signer :
       std::array<Signer, 2>{Signer(), Signer::create("hmac-sha256", "").value()}) {
    EXPECT_FALSE(signer.enabled());
    const Message msg = Session().make("kernel_info_request", json::object());
    const std::vector<std::string> frames = encode(msg, signer);
    EXPECT_EQ(frames[signature_index(frames)], "");
    EXPECT_TRUE(signer.verify("", "{}", "{}", "{}", "{}"));
    EXPECT_TRUE(signer.verify("anything at all", "a", "b", "c", "d"));
    auto decoded = decode(frames, signer);
    EXPECT_TRUE(decoded) << decoded.error().describe();
  }
}

TEST(Codec, BadSignatures) {
  const Fixture fx = load_fixture("stream");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  ASSERT_EQ(reason_of(decode(fx.frames, signer)), "ok");

  // One byte flipped in the content frame.
  {
    std::vector<std::string> frames = fx.frames;
    std::string& content = frames[json_frame_index(frames, 3)];
    const std::size_t at = content.find("hello");
    ASSERT_NE(at, std::string::npos);
    content[at] = 'j';  // still valid JSON: only the HMAC catches it
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_signature");
  }
  // One byte flipped in each of the other JSON frames.
  for (std::size_t which = 0; which < 3; ++which) {
    std::vector<std::string> frames = fx.frames;
    std::string& frame = frames[json_frame_index(frames, which)];
    frame.insert(frame.size() - 1, " ");
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_signature") << which;
  }
  // One hex digit flipped in the signature.
  {
    std::vector<std::string> frames = fx.frames;
    std::string& sig = frames[signature_index(frames)];
    sig[10] = sig[10] == '0' ? '1' : '0';
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_signature");
    sig = fx.frames[signature_index(frames)];
    sig.back() = sig.back() == 'a' ? 'b' : 'a';
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_signature");
  }
  // Empty, short and uppercase signatures.
  for (const std::string& sig : {std::string(), std::string("ab"), std::string(63, '0'), [&] {
                                   std::string upper = fx.frames[signature_index(fx.frames)];
                                   for (char& c : upper) {
                                     c = (c >= 'a' && c <= 'f') ? static_cast<char>(c - 'a' + 'A')
                                                                : c;
                                   }
                                   return upper;
                                 }()}) {
    std::vector<std::string> frames = fx.frames;
    frames[signature_index(frames)] = sig;
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_signature") << "'" << sig << "'";
  }
  // The right frames under a wrong key.
  const Signer wrong = Signer::create("hmac-sha256", fx.key + "x").value();
  EXPECT_EQ(reason_of(decode(fx.frames, wrong)), "bad_signature");
  // The right key under another scheme.
  const Signer sha512 = Signer::create("hmac-sha512", fx.key).value();
  EXPECT_EQ(reason_of(decode(fx.frames, sha512)), "bad_signature");
}

// xeus 2.4 compares only the first 64 characters of the signature frame, so a valid signature
// followed by junk passes unless the adapter checks the length. jupyter_client
// (hmac.compare_digest) rejects it.
TEST(Codec, SignatureWithTrailingBytesIsRejected) {
  const Fixture fx = load_fixture("stream");
  ASSERT_FALSE(fx.frames.empty());
  std::vector<std::string> frames = fx.frames;
  frames[signature_index(frames)] += "junk";
  EXPECT_EQ(reason_of(decode(frames, make_signer(fx))), "bad_signature");
}

// ---- shape errors ----------------------------------------------------------------------------

TEST(Codec, TooFewFramesAfterTheDelimiter) {
  const Fixture fx = load_fixture("execute_reply");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  const std::size_t d = delimiter_index(fx.frames);
  for (std::size_t after = 0; after < 5; ++after) {
    std::vector<std::string> frames(fx.frames.begin(),
                                    fx.frames.begin() + static_cast<std::ptrdiff_t>(d + 1 + after));
    auto r = decode(frames, signer);
    EXPECT_EQ(reason_of(r), "too_few_frames") << after << " frames after the delimiter";
    if (!r) {
      EXPECT_FALSE(r.error().message.empty());
    }
  }
}

TEST(Codec, MissingDelimiter) {
  Fixture fx = load_fixture("stream");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  std::vector<std::string> frames = fx.frames;
  frames.erase(frames.begin() + static_cast<std::ptrdiff_t>(delimiter_index(frames)));
  EXPECT_EQ(reason_of(decode(frames, signer)), "missing_delimiter");
  EXPECT_EQ(reason_of(decode(std::vector<std::string>{}, signer)), "missing_delimiter");
  // Near misses are not the delimiter.
  frames = fx.frames;
  frames[delimiter_index(frames)] = "<IDS|MSG> ";
  EXPECT_EQ(reason_of(decode(frames, signer)), "missing_delimiter");
  frames[1] = std::string("<IDS|MSG>\0", 10);
  EXPECT_EQ(reason_of(decode(frames, signer)), "missing_delimiter");
}

TEST(Codec, InvalidJsonInEachFrame) {
  const Fixture fx = load_fixture("execute_reply");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  for (std::size_t which = 0; which < 4; ++which) {
    for (const std::string& bad : {std::string("{\"a\": "), std::string("not json"), std::string(),
                                   std::string("{}}"), std::string("{\"a\": \"\xff\"}")}) {
      std::vector<std::string> frames = fx.frames;
      frames[json_frame_index(frames, which)] = bad;
      resign(frames, signer);
      EXPECT_EQ(reason_of(decode(frames, signer)), "invalid_json")
          << "frame " << which << ": '" << bad << "'";
    }
  }
}

TEST(Codec, JsonThatIsNotAnObjectIsBadShape) {
  const Fixture fx = load_fixture("execute_reply");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  for (std::size_t which = 0; which < 4; ++which) {
    for (const std::string& bad :
         {std::string("[1, 2]"), std::string("\"text\""), std::string("42"), std::string("null")}) {
      std::vector<std::string> frames = fx.frames;
      frames[json_frame_index(frames, which)] = bad;
      resign(frames, signer);
      EXPECT_EQ(reason_of(decode(frames, signer)), "bad_shape")
          << "frame " << which << ": '" << bad << "'";
    }
  }
  // A header without a string msg_type.
  for (const std::string& header :
       {std::string("{}"), std::string("{\"msg_type\": 3}"), std::string("{\"msg_type\": \"\"}")}) {
    std::vector<std::string> frames = fx.frames;
    frames[json_frame_index(frames, 0)] = header;
    resign(frames, signer);
    EXPECT_EQ(reason_of(decode(frames, signer)), "bad_shape") << header;
  }
}

TEST(Codec, Limits) {
  const Fixture fx = load_fixture("comm_open");
  ASSERT_FALSE(fx.frames.empty());
  const Signer signer = make_signer(fx);
  std::size_t total = 0;
  for (const auto& f : fx.frames) {
    total += f.size();
  }
  Limits limits;
  limits.max_message_bytes = total;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "ok");
  limits.max_message_bytes = total - 1;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "too_large");
  limits.max_message_bytes = 16;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "too_large");
  // too_large is decided before anything else, even on a message without a delimiter.
  EXPECT_EQ(reason_of(decode(std::vector<std::string>{std::string(17, 'x')}, signer, limits)),
            "too_large");

  // comm_open carries two buffers.
  limits = Limits{};
  limits.max_buffers = 2;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "ok");
  limits.max_buffers = 1;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "too_many_buffers");
  limits.max_buffers = 0;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "too_many_buffers");

  // Identities: the default limit is 16.
  std::vector<std::string> frames = fx.frames;
  while (delimiter_index(frames) < 16) {
    frames.insert(frames.begin(), "id");
  }
  EXPECT_EQ(reason_of(decode(frames, signer)), "ok");
  frames.insert(frames.begin(), "one too many");
  EXPECT_EQ(reason_of(decode(frames, signer)), "too_many_identities");
  limits = Limits{};
  limits.max_identities = 0;
  EXPECT_EQ(reason_of(decode(fx.frames, signer, limits)), "too_many_identities");
}

TEST(Codec, UnknownSignatureSchemeIsAnErrorValue) {
  for (const char* scheme : {"hmac-sha3-999", "", "sha256", "HMAC-SHA256"}) {
    Result<Signer> signer = Signer();
    EXPECT_NO_THROW(signer = Signer::create(scheme, "secret")) << scheme;
    ASSERT_FALSE(signer) << scheme;
    EXPECT_EQ(signer.error().reason, "bad_signature_scheme");
    EXPECT_EQ(signer.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(signer.error().message.find(scheme), std::string::npos);
  }
  for (const char* scheme : {"hmac-sha256", "hmac-sha512", "hmac-sha1", "hmac-md5"}) {
    auto signer = Signer::create(scheme, "secret");
    EXPECT_TRUE(signer) << scheme;
  }
}

// xeus maps the scheme "none" to an authenticator that signs with "" and accepts anything, so
// Signer::create("none", key) must not give a Signer whose enabled() is true but that checks
// nothing.
TEST(Codec, SchemeNoneWithAKeyIsRejectedOrVerifies) {
  auto signer = Signer::create("none", "secret");
  if (signer) {
    EXPECT_FALSE(signer->verify("forged", "{}", "{}", "{}", "{}"));
  } else {
    EXPECT_EQ(signer.error().reason, "bad_signature_scheme");
  }
}

TEST(Codec, PeekHeaderFailsCleanlyOnGarbage) {
  EXPECT_EQ(peek_header("").error().reason, "invalid_json");
  EXPECT_EQ(peek_header("not json").error().reason, "invalid_json");
  EXPECT_EQ(peek_header("{\"msg_type\": \"status\"").error().reason, "invalid_json");
  EXPECT_EQ(peek_header(std::string_view("\xff\xfe\x00", 3)).error().reason, "invalid_json");
  EXPECT_EQ(peek_header("[1, 2]").error().reason, "bad_shape");
  EXPECT_EQ(peek_header("\"status\"").error().reason, "bad_shape");
  EXPECT_EQ(peek_header("{}").error().reason, "bad_shape");
  EXPECT_EQ(peek_header("{\"msg_type\": 1}").error().reason, "bad_shape");
  auto partial = peek_header("{\"msg_type\": \"status\", \"msg_id\": 7}");
  ASSERT_TRUE(partial) << partial.error().describe();
  EXPECT_EQ(partial->msg_type, "status");
  EXPECT_EQ(partial->msg_id, "");
  EXPECT_EQ(partial->session, "");
}

// ---- Session ---------------------------------------------------------------------------------

TEST(Session, FormatCheckersOfThisFile) {
  EXPECT_TRUE(is_uuid4("0b7d5a6e-3c1f-4e8a-9b2d-6f4e1c7a9d30"));
  EXPECT_FALSE(is_uuid4("0B7D5A6E-3C1F-4E8A-9B2D-6F4E1C7A9D30"));  // uppercase
  EXPECT_FALSE(is_uuid4("0b7d5a6e-3c1f-1e8a-9b2d-6f4e1c7a9d30"));  // version 1
  EXPECT_FALSE(is_uuid4("0b7d5a6e-3c1f-4e8a-cb2d-6f4e1c7a9d30"));  // variant
  EXPECT_FALSE(is_uuid4("0b7d5a6e3c1f4e8a9b2d6f4e1c7a9d30"));      // no dashes
  EXPECT_TRUE(is_iso8601_utc("2026-11-21T21:47:11.729090Z"));
  EXPECT_FALSE(is_iso8601_utc("2026-11-21T21:47:11.576Z"));
  EXPECT_TRUE(is_iso8601_utc("2026-11-21T21:47:11.576Z", 1));
  EXPECT_FALSE(is_iso8601_utc("2026-11-21T21:47:11.729090+00:00"));
}

TEST(Session, MakeBuildsASpecHeader) {
  const Session session("alice", "session-42");
  EXPECT_EQ(session.username(), "alice");
  EXPECT_EQ(session.id(), "session-42");
  const Message msg = session.make("execute_request", {{"code", "x = 1"}}, {{"tag", "t"}});
  const json& h = msg.header;
  ASSERT_TRUE(h.is_object());
  EXPECT_TRUE(is_uuid4(h.value("msg_id", ""))) << h.dump();
  EXPECT_EQ(h.value("msg_type", ""), "execute_request");
  EXPECT_EQ(h.value("session", ""), "session-42");
  EXPECT_EQ(h.value("username", ""), "alice");
  EXPECT_EQ(h.value("version", ""), "5.3");
  // The exact six-digit form is checked by DatesHaveSixDigitMicroseconds below.
  EXPECT_TRUE(is_iso8601_utc(h.value("date", ""), 1)) << h.value("date", "");
  EXPECT_EQ(msg.msg_type(), "execute_request");
  EXPECT_EQ(msg.msg_id(), h.value("msg_id", ""));
  EXPECT_EQ(msg.content, (json{{"code", "x = 1"}}));
  EXPECT_EQ(msg.metadata, (json{{"tag", "t"}}));
  EXPECT_EQ(msg.parent_header, json::object());
  EXPECT_EQ(msg.parent_msg_id(), "");
  EXPECT_TRUE(msg.identities.empty());
}

// Spec dates are ISO 8601 with microseconds. xeus::iso8601_now() does not zero-pad them: 576 us
// comes out as ".576Z", which readers take for 576 ms, about one date in ten; cellgate formats
// its own.
TEST(Session, DatesHaveSixDigitMicroseconds) {
  const Session session;
  for (int i = 0; i < 2000; ++i) {
    const std::string date = session.make_header("status").value("date", "");
    ASSERT_TRUE(is_iso8601_utc(date)) << date << " after " << i << " dates";
    ASSERT_TRUE(is_iso8601_utc(iso8601_now()));
  }
}

TEST(Session, DefaultSessionIdIsAUuid) {
  const Session a;
  const Session b;
  EXPECT_TRUE(is_uuid4(a.id())) << a.id();
  EXPECT_NE(a.id(), b.id());
  EXPECT_FALSE(a.username().empty());
}

TEST(Session, MakeReplySetsParentAndKeepsIdentities) {
  const Session kernel("kernel", "kernel-session");
  Message request = Session("client", "client-session").make("execute_request", {{"code", ""}});
  request.identities = {"router-peer", std::string("\x00\x01", 2)};
  const Message reply = kernel.make_reply(request, "execute_reply", {{"status", "ok"}});
  EXPECT_EQ(reply.parent_header, request.header);
  EXPECT_EQ(reply.parent_msg_id(), request.msg_id());
  EXPECT_EQ(reply.identities, request.identities);
  EXPECT_EQ(reply.msg_type(), "execute_reply");
  EXPECT_EQ(reply.header.value("session", ""), "kernel-session");
  EXPECT_NE(reply.msg_id(), request.msg_id());
  EXPECT_EQ(reply.content, (json{{"status", "ok"}}));
}

TEST(Session, UuidsAreCanonicalAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = new_uuid();
    ASSERT_TRUE(is_uuid4(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_NE(new_uuid(), new_uuid());
}

TEST(Message, FieldAccessorsToleratesOddHeaders) {
  Message msg;
  EXPECT_EQ(msg.msg_type(), "");
  msg.header = {{"msg_type", 5}, {"msg_id", nullptr}};
  EXPECT_EQ(msg.msg_type(), "");
  EXPECT_EQ(msg.msg_id(), "");
  msg.header = json::array();
  msg.parent_header = "string";
  EXPECT_EQ(msg.msg_type(), "");
  EXPECT_EQ(msg.parent_msg_id(), "");
}

// ---- robustness ------------------------------------------------------------------------------

TEST(Codec, InvalidUtf8EncodesWithoutThrowing) {
  const Signer signer = Signer::create("hmac-sha256", "secret").value();
  Message msg = Session().make("stream", json::object());
  msg.content["name"] = "stdout";
  msg.content["text"] = std::string("bad \xff\xfe bytes \xc3");
  msg.content[std::string("key\x80")] = 1;
  msg.metadata["m"] = std::string("\xed\xa0\x80");  // a UTF-16 surrogate, invalid in UTF-8
  std::vector<std::string> frames;
  ASSERT_NO_THROW(frames = encode(msg, signer));
  auto decoded = decode(frames, signer);
  ASSERT_TRUE(decoded) << decoded.error().describe();
  EXPECT_EQ(decoded->content.value("name", ""), "stdout");
  const std::string text = decoded->content.value("text", "");
  EXPECT_NE(text.find("\xef\xbf\xbd"), std::string::npos) << text;  // U+FFFD
  EXPECT_NE(text.find(" bytes "), std::string::npos) << text;
}

TEST(Codec, RandomFramesNeverCrash) {
  std::mt19937 rng(20261121);
  const Fixture fx = load_fixture("stream");
  ASSERT_FALSE(fx.frames.empty());
  const Signer keyed = make_signer(fx);
  const Signer unkeyed;
  const std::array<std::string, 7> specials = {std::string(kDelimiter),
                                               "{}",
                                               "[]",
                                               "{\"msg_type\": \"x\"}",
                                               "",
                                               "null",
                                               fx.frames[json_frame_index(fx.frames, 0)]};
  auto random_bytes = [&](std::size_t max_len) {
    std::string s(std::uniform_int_distribution<std::size_t>(0, max_len)(rng), '\0');
    for (char& c : s) {
      c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    return s;
  };
  Limits small;
  small.max_message_bytes = 400;
  small.max_identities = 3;
  small.max_buffers = 2;
  int ok_count = 0;
  int error_count = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<std::string> frames;
    if (i % 4 == 0) {
      // Mutate a real message: drop, duplicate or corrupt frames and bytes.
      frames = fx.frames;
      const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int e = 0; e < edits && !frames.empty(); ++e) {
        const std::size_t at =
            std::uniform_int_distribution<std::size_t>(0, frames.size() - 1)(rng);
        switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
          case 0:
            frames.erase(frames.begin() + static_cast<std::ptrdiff_t>(at));
            break;
          case 1:
            frames.insert(frames.begin() + static_cast<std::ptrdiff_t>(at), frames[at]);
            break;
          case 2:
            if (!frames[at].empty()) {
              frames[at].resize(
                  std::uniform_int_distribution<std::size_t>(0, frames[at].size() - 1)(rng));
            }
            break;
          default:
            if (!frames[at].empty()) {
              const std::size_t byte =
                  std::uniform_int_distribution<std::size_t>(0, frames[at].size() - 1)(rng);
              frames[at][byte] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
            }
            break;
        }
      }
    } else {
      const std::size_t count = std::uniform_int_distribution<std::size_t>(0, 12)(rng);
      for (std::size_t f = 0; f < count; ++f) {
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        if (kind < 3) {
          frames.push_back(
              specials[std::uniform_int_distribution<std::size_t>(0, specials.size() - 1)(rng)]);
        } else {
          frames.push_back(random_bytes(kind == 9 ? 300 : 40));
        }
      }
    }
    for (const Signer* signer : {&keyed, &unkeyed}) {
      for (const Limits& limits : {Limits{}, small}) {
        Result<Message> r = make_error(ErrorCode::kInternal, "unset", "");
        ASSERT_NO_THROW(r = decode(frames, *signer, limits));
        if (r) {
          ++ok_count;
          EXPECT_FALSE(r->msg_type().empty());
          EXPECT_NO_THROW((void)encode(*r, *signer));
        } else {
          ++error_count;
          EXPECT_FALSE(r.error().reason.empty());
          EXPECT_FALSE(r.error().message.empty());
        }
      }
      if (auto raw_msg = split(views(frames))) {
        ASSERT_NO_THROW((void)peek_header(raw_msg->header));
      }
    }
  }
  // Both outcomes were exercised.
  EXPECT_GT(ok_count, 0);
  EXPECT_GT(error_count, 0);
}

}  // namespace
}  // namespace cellgate::protocol
