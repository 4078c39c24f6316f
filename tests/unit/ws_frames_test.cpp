// Unit tests of the WebSocket frame formats of /api/kernels/{id}/channels
// (cellgate/server/ws_frames.hpp): legacy JSON, legacy binary and v1.kernel.websocket.jupyter.org,
// against the layouts of ../shared/reference/jupyter-gateway-api.md §5.3–5.5 and frames written
// by hand the way JupyterLab's serialize.ts writes them.
#include "cellgate/protocol/ws_frames.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::protocol {
namespace {

using nlohmann::json;
using protocol::Message;

// ---- helpers ---------------------------------------------------------------------------------

std::string le64(std::uint64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += static_cast<char>((value >> (8 * i)) & 0xffU);
  }
  return out;
}

std::string be32(std::uint32_t value) {
  std::string out;
  for (int i = 3; i >= 0; --i) {
    out += static_cast<char>((value >> (8 * i)) & 0xffU);
  }
  return out;
}

std::uint64_t read_le64(std::string_view frame, std::size_t pos) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(frame[pos + i])) << (8 * i);
  }
  return value;
}

std::uint32_t read_be32(std::string_view frame, std::size_t pos) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8) | static_cast<unsigned char>(frame[pos + i]);
  }
  return value;
}

// Overwrites the 8-byte little-endian word at `pos`.
void set_le64(std::string& frame, std::size_t pos, std::uint64_t value) {
  frame.replace(pos, 8, le64(value));
}

void set_be32(std::string& frame, std::size_t pos, std::uint32_t value) {
  frame.replace(pos, 4, be32(value));
}

// Every byte value 0x00..0xff once.
std::string all_bytes() {
  std::string out;
  for (int i = 0; i < 256; ++i) {
    out += static_cast<char>(static_cast<unsigned char>(i));
  }
  return out;
}

Message sample_message() {
  Message msg;
  msg.header = {{"msg_id", "m-1"},  {"msg_type", "execute_request"},
                {"session", "s-1"}, {"username", "alice"},
                {"version", "5.3"}, {"date", "2024-05-01T12:00:00.123456Z"}};
  msg.parent_header = {{"msg_id", "p-0"}, {"msg_type", "kernel_info_request"}};
  msg.metadata = {{"cellId", "c-7"}};
  msg.content = {{"code", "print('héllo')\n"}, {"silent", false}, {"n", 3}};
  return msg;
}

// A v1 frame written by hand from raw parts (channel, then header/parent/metadata/content, then
// buffers), as serializeV1KernelWebsocketJupyterOrg lays it out.
std::string build_v1(std::string_view channel, const std::vector<std::string>& parts,
                     const std::vector<std::string>& buffers) {
  const std::uint64_t offset_number = 1 + parts.size() + buffers.size() + 1;
  std::vector<std::uint64_t> offsets;
  offsets.push_back(8 * (1 + offset_number));
  offsets.push_back(offsets.back() + channel.size());
  for (const std::string& part : parts) {
    offsets.push_back(offsets.back() + part.size());
  }
  for (const std::string& buffer : buffers) {
    offsets.push_back(offsets.back() + buffer.size());
  }
  std::string out = le64(offset_number);
  for (std::uint64_t offset : offsets) {
    out += le64(offset);
  }
  out += channel;
  for (const std::string& part : parts) {
    out += part;
  }
  for (const std::string& buffer : buffers) {
    out += buffer;
  }
  return out;
}

// A legacy binary frame written by hand, as serializeBinary lays it out.
std::string build_legacy_binary(const std::string& json_text,
                                const std::vector<std::string>& buffers) {
  const auto nbufs = static_cast<std::uint32_t>(1 + buffers.size());
  std::vector<std::uint32_t> offsets = {4 * (nbufs + 1)};
  offsets.push_back(offsets.back() + static_cast<std::uint32_t>(json_text.size()));
  for (std::size_t i = 0; i + 1 < buffers.size(); ++i) {
    offsets.push_back(offsets.back() + static_cast<std::uint32_t>(buffers[i].size()));
  }
  std::string out = be32(nbufs);
  for (std::uint32_t offset : offsets) {
    out += be32(offset);
  }
  out += json_text;
  for (const std::string& buffer : buffers) {
    out += buffer;
  }
  return out;
}

const std::vector<std::string> kV1ValidParts = {
    R"({"msg_id":"m","msg_type":"execute_request","session":"s","username":"u","version":"5.3"})",
    "{}", "{}", R"({"code":"1"})"};

void expect_same(const Result<WsMessage>& got, std::string_view channel, const Message& want) {
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, channel);
  EXPECT_EQ(got->message.header, want.header);
  EXPECT_EQ(got->message.parent_header, want.parent_header);
  EXPECT_EQ(got->message.metadata, want.metadata);
  EXPECT_EQ(got->message.content, want.content);
  EXPECT_EQ(got->message.buffers, want.buffers);
  EXPECT_TRUE(got->message.identities.empty());
}

// The result is a bad_frame error whose message contains `needle`.
void expect_bad_frame(const Result<WsMessage>& got, std::string_view needle) {
  ASSERT_FALSE(got.ok()) << "expected an error containing \"" << needle << "\"";
  EXPECT_EQ(got.error().reason, "bad_frame");
  EXPECT_EQ(got.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(got.error().message.find(needle), std::string::npos)
      << "message: " << got.error().message << "\nwanted: " << needle;
}

// ---- legacy JSON -----------------------------------------------------------------------------

TEST(WsFramesLegacyJson, RoundTrip) {
  const Message msg = sample_message();
  for (const char* channel : {"shell", "control", "stdin", "iopub"}) {
    expect_same(decode_legacy_json(encode_legacy_json(channel, msg)), channel, msg);
  }
}

TEST(WsFramesLegacyJson, TopLevelFields) {
  const Message msg = sample_message();
  const std::string text = encode_legacy_json("iopub", msg);
  const json doc = json::parse(text);
  ASSERT_TRUE(doc.is_object());
  std::set<std::string> keys;
  for (const auto& [key, value] : doc.items()) {
    keys.insert(key);
  }
  ASSERT_EQ(keys, (std::set<std::string>{"header", "msg_id", "msg_type", "parent_header",
                                         "metadata", "content", "buffers", "channel"}));
  EXPECT_EQ(doc["header"], msg.header);
  EXPECT_EQ(doc["msg_id"], "m-1");
  EXPECT_EQ(doc["msg_type"], "execute_request");
  EXPECT_EQ(doc["parent_header"], msg.parent_header);
  EXPECT_EQ(doc["metadata"], msg.metadata);
  EXPECT_EQ(doc["content"], msg.content);
  EXPECT_EQ(doc["buffers"], json::array());
  EXPECT_EQ(doc["channel"], "iopub");
  // The documented order (§5.3): header first, channel last.
  EXPECT_EQ(text.rfind("{\"header\":", 0), 0U) << text;
  const std::string tail = ",\"buffers\":[],\"channel\":\"iopub\"}";
  ASSERT_GT(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << text;
}

TEST(WsFramesLegacyJson, TextFormDropsBuffers) {
  Message msg = sample_message();
  msg.buffers = {"abc", std::string("\0\1", 2)};
  const json doc = json::parse(encode_legacy_json("iopub", msg));
  EXPECT_EQ(doc.value("buffers", json()), json::array());
  auto back = decode_legacy_json(encode_legacy_json("iopub", msg));
  ASSERT_TRUE(back.ok()) << back.error().describe();
  EXPECT_TRUE(back->message.buffers.empty());
}

TEST(WsFramesLegacyJson, ClientDefaults) {
  // What a minimal client sends: no channel, parent_header, metadata or content; extra keys; a
  // "buffers" array and top-level msg_id/msg_type that must not leak into the header.
  auto got = decode_legacy_json(
      R"({"header":{"msg_type":"kernel_info_request","session":"s"},"msg_id":"top",)"
      R"("msg_type":"other","buffers":["YWJj"],"surprise":[1,2]})");
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, "shell");
  EXPECT_EQ(got->message.header, (json{{"msg_type", "kernel_info_request"}, {"session", "s"}}));
  EXPECT_EQ(got->message.parent_header, json::object());
  EXPECT_EQ(got->message.metadata, json::object());
  EXPECT_EQ(got->message.content, json::object());
  EXPECT_TRUE(got->message.buffers.empty());
  EXPECT_EQ(got->message.msg_id(), "");
  EXPECT_TRUE(got->message.identities.empty());

  auto empty_parent = decode_legacy_json(
      R"({"header":{"msg_type":"execute_request"},"parent_header":{},"channel":"control",)"
      R"("content":{"code":"1"},"metadata":null})");
  ASSERT_TRUE(empty_parent.ok()) << empty_parent.error().describe();
  EXPECT_EQ(empty_parent->channel, "control");
  EXPECT_EQ(empty_parent->message.parent_header, json::object());
  EXPECT_EQ(empty_parent->message.metadata, json::object());
  EXPECT_EQ(empty_parent->message.content, (json{{"code", "1"}}));
}

TEST(WsFramesLegacyJson, JupyterLabTextFrame) {
  // JSON.stringify(msg) of a JupyterLab message: insertion order, buffers: [] and the channel.
  const std::string text =
      R"({"header":{"date":"","msg_id":"jl-1","msg_type":"execute_request","session":"sess",)"
      R"("username":"","version":"5.2"},"parent_header":{},"metadata":{"deletedCells":[]},)"
      R"("content":{"code":"1+1","silent":false},"channel":"shell","buffers":[]})";
  auto got = decode_legacy_json(text);
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, "shell");
  EXPECT_EQ(got->message.msg_id(), "jl-1");
  EXPECT_EQ(got->message.msg_type(), "execute_request");
  EXPECT_EQ(got->message.metadata, (json{{"deletedCells", json::array()}}));
  EXPECT_EQ(got->message.content, (json{{"code", "1+1"}, {"silent", false}}));
}

TEST(WsFramesLegacyJson, Errors) {
  expect_bad_frame(decode_legacy_json(""), "not valid JSON");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"x"})"), "not valid JSON");
  expect_bad_frame(decode_legacy_json("[1,2]"), "not a JSON object");
  expect_bad_frame(decode_legacy_json(R"({"content":{}})"), "no header");
  expect_bad_frame(decode_legacy_json(R"({"header":"x"})"), "header is not a JSON object");
  expect_bad_frame(decode_legacy_json(R"({"header":{}})"), "msg_type");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":7}})"), "msg_type");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":""}})"), "msg_type");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"a"},"channel":3})"),
                   "channel is not a string");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"a"},"channel":"hb"})"),
                   "unknown channel \"hb\"");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"a"},"content":[1]})"),
                   "content is not a JSON object");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"a"},"parent_header":"p"})"),
                   "parent_header is not a JSON object");
  expect_bad_frame(decode_legacy_json(R"({"header":{"msg_type":"a"},"metadata":1})"),
                   "metadata is not a JSON object");
  // Invalid UTF-8 inside a JSON string is invalid JSON.
  expect_bad_frame(decode_legacy_json("{\"header\":{\"msg_type\":\"\xff\"}}"), "not valid JSON");
}

// A client's JSON nested deeper than the gateway takes is refused before it becomes a DOM: the
// dump() that passes a message on to its kernel recursed once per level (1 MB of '[' is half a
// million levels and overflowed the stack).
TEST(WsFramesLegacyJson, DeepJsonIsRefusedBeforeParsing) {
  const std::size_t n = 500000;
  const std::string deep = R"({"header":{"msg_type":"execute_request"},"content":{"x":)" +
                           std::string(n, '[') + std::string(n, ']') + "}}";
  expect_bad_frame(decode_legacy_json(deep), "deeper than 256 levels");
  const std::string fine = R"({"header":{"msg_type":"execute_request"},"content":{"x":)" +
                           std::string(250, '[') + std::string(250, ']') + "}}";
  auto ok = decode_legacy_json(fine);
  ASSERT_TRUE(ok) << ok.error().describe();
  EXPECT_FALSE(encode_legacy_json("shell", ok->message).empty());
}

// A kernel's frame nested deeper is refused by the envelope with its own reason, which the kernel
// client turns into a line for the request's clients.
TEST(Envelope, DeepFramesAreTooDeep) {
  Frames frames;
  frames.header = R"({"msg_id":"m","msg_type":"display_data"})";
  frames.parent_header = "{}";
  frames.metadata = "{}";
  frames.content =
      R"({"data":{"application/json":)" + std::string(300, '[') + std::string(300, ']') + "}}";
  auto env = Envelope::from_frames(Channel::kIopub, frames);
  ASSERT_FALSE(env);
  EXPECT_EQ(env.error().reason, "too_deep");
  EXPECT_NE(env.error().message.find("content frame nests JSON deeper than 256 levels"),
            std::string::npos)
      << env.error().message;
  frames.content =
      R"({"data":{"application/json":)" + std::string(200, '[') + std::string(200, ']') + "}}";
  EXPECT_TRUE(Envelope::from_frames(Channel::kIopub, frames));
}

// ---- legacy binary ---------------------------------------------------------------------------

TEST(WsFramesLegacyBinary, RoundTripWithBuffers) {
  const std::vector<std::vector<std::string>> cases = {
      {"x"}, {all_bytes()}, {""}, {"", ""}, {all_bytes(), "", std::string(1000, '\0'), "tail"},
  };
  for (const auto& buffers : cases) {
    Message msg = sample_message();
    msg.buffers = buffers;
    const std::string frame = encode_legacy_binary("iopub", msg);
    ASSERT_GE(frame.size(), 4U);
    EXPECT_EQ(read_be32(frame, 0), 1 + buffers.size());
    EXPECT_EQ(read_be32(frame, 4), 4 * (2 + buffers.size()));
    expect_same(decode_legacy_binary(frame), "iopub", msg);
  }
}

TEST(WsFramesLegacyBinary, JsonPartHasChannelAndNoBuffers) {
  Message msg = sample_message();
  msg.buffers = {"abc", all_bytes()};
  const std::string frame = encode_legacy_binary("shell", msg);
  ASSERT_EQ(read_be32(frame, 0), 3U);
  const std::uint32_t start = read_be32(frame, 4);
  const std::uint32_t stop = read_be32(frame, 8);
  const std::uint32_t last = read_be32(frame, 12);
  EXPECT_EQ(start, 16U);
  EXPECT_EQ(last - stop, 3U);
  EXPECT_EQ(frame.size() - last, 256U);
  EXPECT_EQ(frame.substr(stop, 3), "abc");
  EXPECT_EQ(frame.substr(last), all_bytes());
  const json doc = json::parse(frame.substr(start, stop - start));
  EXPECT_FALSE(doc.contains("buffers"));
  EXPECT_EQ(doc.value("channel", json()), "shell");
  EXPECT_EQ(doc.value("msg_id", json()), "m-1");
  EXPECT_EQ(doc.value("msg_type", json()), "execute_request");
  EXPECT_EQ(doc.value("content", json()), msg.content);
}

TEST(WsFramesLegacyBinary, EncodeLegacyPicksTheForm) {
  Message msg = sample_message();
  bool binary = true;
  const std::string text = encode_legacy("iopub", msg, binary);
  EXPECT_FALSE(binary);
  EXPECT_EQ(text, encode_legacy_json("iopub", msg));

  msg.buffers = {""};
  const std::string bin = encode_legacy("iopub", msg, binary);
  EXPECT_TRUE(binary);
  EXPECT_EQ(bin, encode_legacy_binary("iopub", msg));
  expect_same(decode_legacy_binary(bin), "iopub", msg);
}

TEST(WsFramesLegacyBinary, JupyterLabFrame) {
  // serializeBinary: JSON.stringify(msg) with "buffers" deleted, then the buffers.
  const std::string text =
      R"({"header":{"msg_id":"jl-2","username":"","session":"sess","msg_type":"comm_msg",)"
      R"("version":"5.2","date":""},"parent_header":{},"metadata":{},)"
      R"("content":{"comm_id":"c1","data":{"method":"update"}},"channel":"shell"})";
  const std::string b0 = std::string("\x00\x01\xfe\xff", 4);
  const std::string b1 = "PNG";
  std::string frame = be32(3);
  frame += be32(16);
  frame += be32(static_cast<std::uint32_t>(16 + text.size()));
  frame += be32(static_cast<std::uint32_t>(16 + text.size() + b0.size()));
  frame += text + b0 + b1;
  ASSERT_EQ(frame, build_legacy_binary(text, {b0, b1}));

  auto got = decode_legacy_binary(frame);
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, "shell");
  EXPECT_EQ(got->message.msg_id(), "jl-2");
  EXPECT_EQ(got->message.msg_type(), "comm_msg");
  EXPECT_EQ(got->message.content["data"]["method"], "update");
  EXPECT_EQ(got->message.buffers, (std::vector<std::string>{b0, b1}));
}

TEST(WsFramesLegacyBinary, MissingChannelIsShell) {
  auto got = decode_legacy_binary(build_legacy_binary(R"({"header":{"msg_type":"a"}})", {"z"}));
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, "shell");
  EXPECT_EQ(got->message.buffers, (std::vector<std::string>{"z"}));
}

TEST(WsFramesLegacyBinary, EveryTruncationBeforeTheLastBufferFails) {
  Message msg = sample_message();
  msg.buffers = {"abc", all_bytes()};
  const std::string frame = encode_legacy_binary("iopub", msg);
  const std::size_t last = read_be32(frame, 12);
  for (std::size_t len = 0; len < last; ++len) {
    auto got = decode_legacy_binary(std::string_view(frame).substr(0, len));
    ASSERT_FALSE(got.ok()) << "prefix of " << len << " bytes decoded";
    EXPECT_EQ(got.error().reason, "bad_frame");
  }
  // The last buffer runs to the end of the frame and no end offset is stored, so a cut inside
  // it is indistinguishable from a shorter buffer (a property of the format).
  for (std::size_t len = last; len <= frame.size(); ++len) {
    auto got = decode_legacy_binary(std::string_view(frame).substr(0, len));
    ASSERT_TRUE(got.ok()) << got.error().describe();
    EXPECT_EQ(got->message.buffers.back(), all_bytes().substr(0, len - last));
  }
}

TEST(WsFramesLegacyBinary, EveryTruncationFailsWhenTheLastBufferIsEmpty) {
  Message msg = sample_message();
  msg.buffers = {all_bytes(), ""};
  const std::string frame = encode_legacy_binary("iopub", msg);
  ASSERT_TRUE(decode_legacy_binary(frame).ok());
  for (std::size_t len = 0; len < frame.size(); ++len) {
    auto got = decode_legacy_binary(std::string_view(frame).substr(0, len));
    ASSERT_FALSE(got.ok()) << "prefix of " << len << " bytes decoded";
    EXPECT_EQ(got.error().reason, "bad_frame");
  }
}

TEST(WsFramesLegacyBinary, HostileOffsetTables) {
  const std::string text = R"({"header":{"msg_type":"a"},"channel":"iopub"})";
  const std::string good = build_legacy_binary(text, {"one", "two"});
  ASSERT_TRUE(decode_legacy_binary(good).ok());

  for (std::uint32_t nbufs : {0U, 1U}) {
    std::string frame = good;
    set_be32(frame, 0, nbufs);
    expect_bad_frame(decode_legacy_binary(frame), "is below 2");
  }
  for (std::uint32_t nbufs : {0xffffffffU, 0x80000000U, 0x40000000U, 0x3fffffffU, 1000U}) {
    std::string frame = good;
    set_be32(frame, 0, nbufs);
    expect_bad_frame(decode_legacy_binary(frame), "does not fit");
  }
  {
    std::string frame = good;  // offsets 2 and 1 swapped: decreasing
    const std::uint32_t o1 = read_be32(frame, 8);
    const std::uint32_t o2 = read_be32(frame, 12);
    set_be32(frame, 8, o2);
    set_be32(frame, 12, o1);
    expect_bad_frame(
        decode_legacy_binary(frame),
        "offset 2 (" + std::to_string(o1) + ") is before offset 1 (" + std::to_string(o2) + ")");
  }
  {
    std::string frame = good;
    set_be32(frame, 12, 0xffffffffU);
    expect_bad_frame(decode_legacy_binary(frame),
                     "legacy binary frame: offset 2 (4294967295) is past the end of the " +
                         std::to_string(good.size()) + "-byte frame");
  }
  {
    std::string frame = good;  // offset 0 pointing into the table
    set_be32(frame, 4, 0);
    expect_bad_frame(decode_legacy_binary(frame),
                     "offset 0 (0) is not the end of the offset table");
  }
  {
    // Padding between the table and the JSON is rejected: offset_0 must be 4*(nbufs+1).
    std::string frame = be32(2) + be32(16) + be32(static_cast<std::uint32_t>(16 + text.size()));
    frame += std::string(4, ' ') + text + "buf";
    expect_bad_frame(decode_legacy_binary(frame),
                     "offset 0 (16) is not the end of the offset table (12)");
  }
}

TEST(WsFramesLegacyBinary, InvalidJsonPart) {
  expect_bad_frame(decode_legacy_binary(build_legacy_binary(R"({"header":)", {"b"})),
                   "legacy binary frame: the JSON part is not valid JSON");
  expect_bad_frame(decode_legacy_binary(build_legacy_binary("", {"b"})), "not valid JSON");
  expect_bad_frame(decode_legacy_binary(build_legacy_binary("\"str\"", {"b"})),
                   "not a JSON object");
  expect_bad_frame(decode_legacy_binary(
                       build_legacy_binary(R"({"header":{"msg_type":"a"},"channel":"x"})", {"b"})),
                   "unknown channel");
}

// ---- v1 --------------------------------------------------------------------------------------

TEST(WsFramesV1, RoundTrip) {
  const std::vector<std::vector<std::string>> cases = {
      {}, {""}, {all_bytes()}, {"", "", ""}, {"a", all_bytes(), "", std::string(3, '\0')}};
  for (const auto& buffers : cases) {
    Message msg = sample_message();
    msg.buffers = buffers;
    for (const char* channel : {"shell", "control", "stdin", "iopub"}) {
      const std::string frame = encode_v1(channel, msg);
      EXPECT_EQ(read_le64(frame, 0), 6 + buffers.size());
      expect_same(decode_v1(frame), channel, msg);
    }
  }
}

TEST(WsFramesV1, WorkedExample) {
  // §5.5: 120-byte header, 2-byte parent, 2-byte metadata, 30-byte content, no buffers.
  const std::string header_text =
      R"({"date":"2024-05-01T12:00:00Z","msg_id":"m1","msg_type":"execute_request",)"
      R"("session":"s1","username":"u","version":"5.3"})";
  const std::string content_text = R"({"code":"2*21","silent":false})";
  ASSERT_EQ(header_text.size(), 120U);
  ASSERT_EQ(content_text.size(), 30U);
  Message msg;
  msg.header = json::parse(header_text);
  msg.content = json::parse(content_text);

  const std::string frame = encode_v1("shell", msg);
  std::string expected = le64(6);
  for (std::uint64_t offset : {56U, 61U, 181U, 183U, 185U, 215U}) {
    expected += le64(offset);
  }
  expected += "shell" + header_text + "{}" + "{}" + content_text;
  ASSERT_EQ(expected.size(), 215U);
  EXPECT_EQ(frame.size(), 215U);
  EXPECT_EQ(frame, expected);
  // Little-endian on the wire whatever the host: 6 then seven zero bytes.
  EXPECT_EQ(frame.substr(0, 8), std::string("\x06\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(frame.substr(8, 8), std::string("\x38\0\0\0\0\0\0\0", 8));

  expect_same(decode_v1(expected), "shell", msg);
}

TEST(WsFramesV1, JupyterLabFrame) {
  // serializeV1KernelWebsocketJupyterOrg: JSON.stringify (insertion order), offsetNumber =
  // 1 + 4 + buffers + 1, offsets from 8 * (1 + offsetNumber), written by hand here.
  const std::string channel = "shell";
  const std::string header =
      R"({"msg_id":"jl-3","username":"","session":"sess","msg_type":"comm_msg",)"
      R"("version":"5.2","date":"2024-05-01T12:00:00.000Z"})";
  const std::string parent = "{}";
  const std::string metadata = "{}";
  const std::string content = R"({"comm_id":"c1","data":{"buffer_paths":[["x"]]}})";
  const std::string buffer = std::string("\x00\x01\xff", 3);
  std::string frame = le64(7);
  std::uint64_t pos = 64;
  frame += le64(pos);
  for (const std::string* part : {&channel, &header, &parent, &metadata, &content, &buffer}) {
    pos += part->size();
    frame += le64(pos);
  }
  ASSERT_EQ(frame.size(), 64U);
  frame += channel + header + parent + metadata + content + buffer;
  ASSERT_EQ(frame.size(), pos);

  auto got = decode_v1(frame);
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->channel, "shell");
  EXPECT_EQ(got->message.msg_id(), "jl-3");
  EXPECT_EQ(got->message.msg_type(), "comm_msg");
  EXPECT_EQ(got->message.parent_header, json::object());
  EXPECT_EQ(got->message.content["comm_id"], "c1");
  EXPECT_EQ(got->message.buffers, (std::vector<std::string>{buffer}));
}

TEST(WsFramesV1, EmptyPartsAreEmptyObjects) {
  auto got = decode_v1(build_v1("iopub", {kV1ValidParts[0], "", "", ""}, {}));
  ASSERT_TRUE(got.ok()) << got.error().describe();
  EXPECT_EQ(got->message.parent_header, json::object());
  EXPECT_EQ(got->message.metadata, json::object());
  EXPECT_EQ(got->message.content, json::object());
  auto null_parent = decode_v1(build_v1("iopub", {kV1ValidParts[0], "null", "{}", "{}"}, {}));
  ASSERT_TRUE(null_parent.ok()) << null_parent.error().describe();
  EXPECT_EQ(null_parent->message.parent_header, json::object());
}

TEST(WsFramesV1, EveryTruncationFails) {
  Message msg = sample_message();
  msg.buffers = {"abc", all_bytes()};
  const std::string frame = encode_v1("iopub", msg);
  ASSERT_TRUE(decode_v1(frame).ok());
  for (std::size_t len = 0; len < frame.size(); ++len) {
    auto got = decode_v1(std::string_view(frame).substr(0, len));
    ASSERT_FALSE(got.ok()) << "prefix of " << len << " bytes decoded";
    EXPECT_EQ(got.error().reason, "bad_frame");
  }
  expect_bad_frame(decode_v1(frame + "x"), "is not the frame length");
}

TEST(WsFramesV1, HostileOffsetTables) {
  const std::string good = build_v1("shell", kV1ValidParts, {"buf"});
  ASSERT_TRUE(decode_v1(good).ok());

  for (std::uint64_t n : {0ULL, 1ULL, 5ULL}) {
    std::string frame = good;
    set_le64(frame, 0, n);
    expect_bad_frame(decode_v1(frame), "is below 6");
  }
  // 2^61 - 1 and 2^61 make 8 * (1 + n) wrap to 0 and 8; 2^63 and 2^64 - 1 overflow any product.
  for (std::uint64_t n : {(1ULL << 61) - 1, 1ULL << 61, 1ULL << 63, ~0ULL, 1000ULL, 24ULL}) {
    std::string frame = good;
    set_le64(frame, 0, n);
    expect_bad_frame(decode_v1(frame),
                     "entries does not fit in the " + std::to_string(good.size()) + "-byte frame");
  }
  {
    std::string frame = good;  // offset 3 past the end
    set_le64(frame, 8 * 4, 812);
    expect_bad_frame(decode_v1(frame), "v1 frame: offset 3 (812) is past the end of the " +
                                           std::to_string(good.size()) + "-byte frame");
  }
  {
    std::string frame = good;
    set_le64(frame, 8 * 7, ~0ULL);
    expect_bad_frame(decode_v1(frame), "offset 6 (18446744073709551615) is past the end");
  }
  {
    std::string frame = good;  // offsets 1 and 2 swapped
    const std::uint64_t o1 = read_le64(frame, 16);
    const std::uint64_t o2 = read_le64(frame, 24);
    set_le64(frame, 16, o2);
    set_le64(frame, 24, o1);
    expect_bad_frame(decode_v1(frame), "offset 2 (" + std::to_string(o1) +
                                           ") is before offset 1 (" + std::to_string(o2) + ")");
  }
  {
    std::string frame = good;  // offset 0 inside the table
    set_le64(frame, 8, 8);
    expect_bad_frame(decode_v1(frame), "offset 0 (8) is not the end of the offset table (64)");
  }
  {
    std::string frame = good;  // last offset short of the end
    set_le64(frame, 8 * 7, read_le64(frame, 8 * 7) - 1);
    expect_bad_frame(decode_v1(frame), "is not the frame length");
  }
  {
    // A table of 6 words claimed by a frame that only has room for the count.
    expect_bad_frame(decode_v1(le64(6)), "does not fit in the 8-byte frame");
    expect_bad_frame(decode_v1("short"), "too short");
  }
}

TEST(WsFramesV1, InvalidJsonInEachPart) {
  const char* names[] = {"header", "parent_header", "metadata", "content"};
  for (std::size_t i = 0; i < 4; ++i) {
    for (const std::string& bad :
         {std::string(R"({"a":)"), std::string("{\"a\":\"\xff\"}"), std::string("nope")}) {
      std::vector<std::string> parts = kV1ValidParts;
      parts[i] = bad;
      expect_bad_frame(decode_v1(build_v1("shell", parts, {})),
                       std::string("v1 frame: ") + names[i] + " is not valid JSON");
    }
    if (i > 0) {
      std::vector<std::string> parts = kV1ValidParts;
      parts[i] = "[1]";
      expect_bad_frame(decode_v1(build_v1("shell", parts, {})),
                       std::string(names[i]) + " is not a JSON object");
    }
  }
  expect_bad_frame(decode_v1(build_v1("shell", {"", "{}", "{}", "{}"}, {})),
                   "header is not valid JSON");
  expect_bad_frame(decode_v1(build_v1("shell", {"[]", "{}", "{}", "{}"}, {})),
                   "header is not a JSON object");
  expect_bad_frame(decode_v1(build_v1("shell", {R"({"msg_id":"x"})", "{}", "{}", "{}"}, {})),
                   "header has no string msg_type");
}

TEST(WsFramesV1, Channels) {
  for (const char* channel : {"hb", "", "Shell", "shell ", "iopub\n"}) {
    expect_bad_frame(decode_v1(build_v1(channel, kV1ValidParts, {})), "unknown channel");
  }
  expect_bad_frame(decode_v1(build_v1(std::string("sh\0ll", 5), kV1ValidParts, {})),
                   "unknown channel \"sh\\x00ll\"");
}

// ---- all formats -----------------------------------------------------------------------------

TEST(WsFrames, InvalidUtf8EncodesWithoutThrowing) {
  Message msg = sample_message();
  msg.content = {{"name", "stdout"}, {"text", std::string("bad \xff\xfe and \xc3 end")}};
  msg.metadata = {{std::string("k\xff"), 1}};
  msg.buffers = {std::string("\xff\xfe", 2)};
  std::string text;
  std::string bin;
  std::string v1;
  ASSERT_NO_THROW(text = encode_legacy_json("iopub", msg));
  ASSERT_NO_THROW(bin = encode_legacy_binary("iopub", msg));
  ASSERT_NO_THROW(v1 = encode_v1("iopub", msg));
  const std::string replacement = "\xef\xbf\xbd";  // U+FFFD
  EXPECT_NE(text.find(replacement), std::string::npos);
  EXPECT_EQ(text.find('\xff'), std::string::npos);
  EXPECT_NE(v1.find(replacement), std::string::npos);

  for (const auto& got : {decode_legacy_json(text), decode_legacy_binary(bin), decode_v1(v1)}) {
    ASSERT_TRUE(got.ok()) << got.error().describe();
    const std::string decoded = got->message.content.value("text", std::string());
    EXPECT_EQ(decoded.rfind("bad ", 0), 0U);
    EXPECT_NE(decoded.find(replacement), std::string::npos);
    EXPECT_EQ(decoded.find('\xff'), std::string::npos);
  }
}

// Checks the promises of a decoder on an arbitrary frame: no exception, and either a bad_frame
// error with a message or a message that satisfies the documented invariants.
void check_decoder_promises(Result<WsMessage> (*decode)(std::string_view), std::string_view frame,
                            int& ok_count, int& error_count) {
  Result<WsMessage> got = make_error(ErrorCode::kInternal, "unset", "");
  ASSERT_NO_THROW(got = decode(frame));
  if (!got.ok()) {
    ++error_count;
    ASSERT_EQ(got.error().reason, "bad_frame");
    ASSERT_FALSE(got.error().message.empty());
    return;
  }
  ++ok_count;
  static const std::set<std::string> kChannels = {"shell", "control", "stdin", "iopub"};
  ASSERT_TRUE(kChannels.count(got->channel) == 1) << got->channel;
  ASSERT_TRUE(got->message.header.is_object());
  ASSERT_FALSE(got->message.msg_type().empty());
  ASSERT_TRUE(got->message.parent_header.is_object());
  ASSERT_TRUE(got->message.metadata.is_object());
  ASSERT_TRUE(got->message.content.is_object());
  ASSERT_TRUE(got->message.identities.empty());
  std::size_t total = 0;
  for (const std::string& buffer : got->message.buffers) {
    total += buffer.size();
  }
  ASSERT_LE(total, frame.size());
}

TEST(WsFrames, RandomFuzzThroughAllDecoders) {
  std::mt19937_64 rng(0xC0FFEE);
  auto below = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  Message msg = sample_message();
  msg.buffers = {"abc", all_bytes().substr(0, 40), ""};
  const std::vector<std::string> seeds = {
      encode_v1("iopub", msg),
      encode_legacy_binary("shell", msg),
      encode_legacy_json("stdin", msg),
      build_v1("control", kV1ValidParts, {}),
      build_legacy_binary(R"({"header":{"msg_type":"a"}})", {"b"}),
  };
  Result<WsMessage> (*const decoders[])(std::string_view) = {decode_legacy_json,
                                                             decode_legacy_binary, decode_v1};
  int ok_count = 0;
  int error_count = 0;
  constexpr int kFrames = 4000;
  for (int round = 0; round < kFrames; ++round) {
    std::string frame;
    if (round % 5 == 0) {
      frame.resize(below(300));
      for (char& c : frame) {
        c = static_cast<char>(below(256));
      }
      if (frame.size() >= 8 && below(2) == 0) {
        set_le64(frame, 0, below(12));  // a plausible v1 offset count over random bytes
      }
    } else {
      frame = seeds[below(seeds.size())];
      const std::size_t edits = 1 + below(4);
      for (std::size_t e = 0; e < edits && !frame.empty(); ++e) {
        const std::size_t pos = below(frame.size());
        switch (below(6)) {
          case 0:
            frame[pos] = static_cast<char>(below(256));
            break;
          case 1:
            frame[pos] = static_cast<char>(frame[pos] ^ (1 << below(8)));
            break;
          case 2:
            frame.resize(pos);
            break;
          case 3:
            frame.insert(pos, 1, static_cast<char>(below(256)));
            break;
          case 4:
            if (frame.size() >= 8) {  // rewrite a word of an offset table, sometimes nearby
              const std::size_t word = 8 * below(frame.size() / 8);
              const std::uint64_t old = read_le64(frame, word);
              set_le64(frame, word, below(2) == 0 ? old + below(5) - 2 : rng());
            }
            break;
          default:
            if (frame.size() >= 4) {
              const std::size_t word = 4 * below(frame.size() / 4);
              set_be32(frame, word,
                       static_cast<std::uint32_t>(read_be32(frame, word) + below(5) - 2));
            }
            break;
        }
      }
    }
    for (auto* decode : decoders) {
      check_decoder_promises(decode, frame, ok_count, error_count);
      if (testing::Test::HasFatalFailure()) {
        FAIL() << "round " << round << ", frame of " << frame.size() << " bytes";
      }
    }
  }
  // The mutations must reach both outcomes, or the fuzz is not exercising the decoders.
  EXPECT_GT(ok_count, 100);
  EXPECT_GT(error_count, 1000);
  EXPECT_EQ(ok_count + error_count, 3 * kFrames);
}

}  // namespace
}  // namespace cellgate::protocol
