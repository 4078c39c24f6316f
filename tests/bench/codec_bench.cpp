// Micro-benchmark: cellgate's codec against xeus::xzmq_serializer on the per-message hot path.
//
// Decode = frames -> verified, parsed message. Route = frames -> verified header fields only
// (what the gateway needs to forward a message byte for byte). Encode = parsed -> signed frames.
// Sizes: a status message (~300 B) and a display_data carrying a 1 MiB base64 PNG.
//
// Bridge = what the gateway does for one kernel message on its way to a WebSocket client: today
// an Envelope (split, verify, copy, check the JSON with simdjson, peek the header and parent)
// and the frame for the client's format, spliced from the frames (v1: byte for byte); before,
// a full decode (nlohmann DOM) and an encode per listener.
#include <benchmark/benchmark.h>

#include <xeus/xauthentication.hpp>
#include <xeus/xzmq_serializer.hpp>
#include <zmq_addon.hpp>

#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/ws_frames.hpp"

namespace {

using cellgate::protocol::Message;
using cellgate::protocol::Session;
using cellgate::protocol::Signer;
using nlohmann::json;

const std::string kKey = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

Message sample(bool large) {
  Session session("bench");
  Message parent = session.make("execute_request", json{{"code", "plot()"}});
  if (!large) {
    return session.make_reply(parent, "status", json{{"execution_state", "busy"}});
  }
  std::string png(1 << 20, 'A');
  return session.make_reply(
      parent, "display_data",
      json{{"data", {{"image/png", png}, {"text/plain", "<Figure size 640x480>"}}},
           {"metadata", json::object()},
           {"transient", json::object()}});
}

std::vector<std::string> wire(bool large) {
  auto signer = Signer::create("hmac-sha256", kKey);
  return cellgate::protocol::encode(sample(large), signer.value());
}

zmq::multipart_t to_multipart(const std::vector<std::string>& frames) {
  zmq::multipart_t mp;
  for (const auto& f : frames) {
    mp.addstr(f);
  }
  return mp;
}

void BM_CellgateDecode(benchmark::State& state) {
  auto signer = Signer::create("hmac-sha256", kKey).value();
  auto frames = wire(state.range(0) != 0);
  std::vector<std::string_view> views(frames.begin(), frames.end());
  for (auto _ : state) {
    auto msg = cellgate::protocol::decode(std::span<const std::string_view>(views), signer);
    benchmark::DoNotOptimize(msg);
  }
}

void BM_CellgateRoute(benchmark::State& state) {
  auto signer = Signer::create("hmac-sha256", kKey).value();
  auto frames = wire(state.range(0) != 0);
  std::vector<std::string_view> views(frames.begin(), frames.end());
  for (auto _ : state) {
    auto raw = cellgate::protocol::split(std::span<const std::string_view>(views));
    auto ok = cellgate::protocol::verify(raw.value(), signer);
    auto info = cellgate::protocol::peek_header(raw->header);
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(info);
  }
}

void BM_XeusDeserialize(benchmark::State& state) {
  auto auth = xeus::make_xauthentication("hmac-sha256", kKey);
  auto frames = wire(state.range(0) != 0);
  for (auto _ : state) {
    state.PauseTiming();  // xeus consumes a multipart_t; building it is not decoding
    auto mp = to_multipart(frames);
    state.ResumeTiming();
    auto msg = xeus::xzmq_serializer::deserialize(mp, *auth);
    benchmark::DoNotOptimize(msg);
  }
}

void BM_CellgateEncode(benchmark::State& state) {
  auto signer = Signer::create("hmac-sha256", kKey).value();
  Message msg = sample(state.range(0) != 0);
  for (auto _ : state) {
    auto frames = cellgate::protocol::encode(msg, signer);
    benchmark::DoNotOptimize(frames);
  }
}

void BM_XeusSerialize(benchmark::State& state) {
  auto auth = xeus::make_xauthentication("hmac-sha256", kKey);
  Message msg = sample(state.range(0) != 0);
  for (auto _ : state) {
    state.PauseTiming();  // xeus consumes its message; copying ours into it is not encoding
    xeus::xmessage xmsg({}, msg.header, msg.parent_header, msg.metadata, msg.content, {});
    state.ResumeTiming();
    auto mp = xeus::xzmq_serializer::serialize(std::move(xmsg), *auth);
    benchmark::DoNotOptimize(mp);
  }
}

// range(1): 0 legacy JSON text, 1 v1 binary.
void BM_EnvelopeBridge(benchmark::State& state) {
  auto signer = Signer::create("hmac-sha256", kKey).value();
  auto frames = wire(state.range(0) != 0);
  std::vector<std::string_view> views(frames.begin(), frames.end());
  const bool v1 = state.range(1) != 0;
  for (auto _ : state) {
    auto env = cellgate::protocol::Envelope::from_wire(
        cellgate::protocol::Channel::kIopub, std::span<const std::string_view>(views), signer);
    const std::string& out = v1 ? env.value()->ws_v1() : env.value()->ws_legacy(nullptr);
    benchmark::DoNotOptimize(out.data());
  }
}

void BM_DecodeEncodeBridge(benchmark::State& state) {
  auto signer = Signer::create("hmac-sha256", kKey).value();
  auto frames = wire(state.range(0) != 0);
  std::vector<std::string_view> views(frames.begin(), frames.end());
  const bool v1 = state.range(1) != 0;
  for (auto _ : state) {
    auto msg = cellgate::protocol::decode(std::span<const std::string_view>(views), signer);
    bool binary = false;
    std::string out = v1 ? cellgate::protocol::encode_v1("iopub", msg.value())
                         : cellgate::protocol::encode_legacy("iopub", msg.value(), binary);
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_EnvelopeBridge)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"large", "v1"});
BENCHMARK(BM_DecodeEncodeBridge)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"large", "v1"});
BENCHMARK(BM_CellgateRoute)->Arg(0)->Arg(1)->ArgName("large");
BENCHMARK(BM_CellgateDecode)->Arg(0)->Arg(1)->ArgName("large");
BENCHMARK(BM_XeusDeserialize)->Arg(0)->Arg(1)->ArgName("large");
BENCHMARK(BM_CellgateEncode)->Arg(0)->Arg(1)->ArgName("large");
BENCHMARK(BM_XeusSerialize)->Arg(0)->Arg(1)->ArgName("large");

}  // namespace

BENCHMARK_MAIN();
