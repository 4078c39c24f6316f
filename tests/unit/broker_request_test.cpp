// The broker's wire (kernel-launcher/broker/src/request.cpp): what the unprivileged gateway may
// ask, parsed into typed requests, and everything else refused with a reason. No root, no Python.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/broker/request.hpp"

namespace cellgate::broker {
namespace {

using json = nlohmann::json;

json launch(std::string kernel_id = "k1", json uid = 2900000) {
  return {{"op", "launch"},
          {"id", 7},
          {"kernel_id", std::move(kernel_id)},
          {"kernelspec", "python3"},
          {"uid", std::move(uid)},
          {"env", {{"A", "1"}}}};
}

// The refusal's message, or "" when the request was accepted.
std::string refusal(const json& request, std::uint64_t* id = nullptr) {
  std::uint64_t got = 0;
  auto r = parse_request(request.dump(), &got);
  if (id != nullptr) {
    *id = got;
  }
  if (r) {
    return "";
  }
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().reason, "broker_refused");
  return r.error().message;
}

TEST(BrokerRequest, ParsesEachOpIntoItsStruct) {
  std::uint64_t id = 0;
  auto r = parse_request(launch().dump(), &id);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(id, 7u);
  EXPECT_EQ(r->op(), Op::kLaunch);
  const auto& l = std::get<LaunchRequest>(r->body);
  EXPECT_EQ(l.kernel_id, "k1");
  EXPECT_EQ(l.kernelspec, "python3");
  EXPECT_EQ(l.uid, 2900000u);
  EXPECT_EQ(l.env.at("A"), "1");

  r = parse_request(R"({"id":2,"op":"signal","handle":3,"signal":2})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<SignalRequest>(r->body).signal, SIGINT);
  EXPECT_EQ(std::get<SignalRequest>(r->body).handle, 3u);
  r = parse_request(R"({"id":2,"op":"stop","handle":3})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->op(), Op::kStop);
  r = parse_request(R"({"id":2,"op":"detach","handle":3})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->op(), Op::kDetach);
  r = parse_request(R"({"id":2,"op":"log_tail","handle":3,"max_bytes":99999999})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<LogTailRequest>(r->body).max_bytes, kMaxLogTail);  // clamped
  r = parse_request(R"({"id":2,"op":"log_tail","handle":3})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<LogTailRequest>(r->body).max_bytes, 2000u);
  r = parse_request(R"({"id":2,"op":"release_work","kernel_id":"k1"})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<ReleaseWorkRequest>(r->body).kernel_id, "k1");
  r = parse_request(R"({"id":2,"op":"wait_fast","timeout_ms":-5})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<WaitFastRequest>(r->body).timeout.count(), 0);
  r = parse_request(R"({"id":2,"op":"wait_fast","timeout_ms":99999999})", &id);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::get<WaitFastRequest>(r->body).timeout, kMaxWaitFast);
}

TEST(BrokerRequest, RefusesWhatIsNotARequestWithTheIdItCouldRead) {
  std::uint64_t id = 99;
  auto r = parse_request("{not json", &id);
  ASSERT_FALSE(r);
  EXPECT_EQ(id, 0u);
  EXPECT_FALSE(parse_request("[1,2]", &id));
  EXPECT_FALSE(parse_request("", &id));
  EXPECT_FALSE(parse_request(R"({"op":"stop","handle":1})", &id));          // no id
  EXPECT_FALSE(parse_request(R"({"id":0,"op":"stop","handle":1})", &id));   // id 0
  EXPECT_FALSE(parse_request(R"({"id":-1,"op":"stop","handle":1})", &id));  // not unsigned
  EXPECT_FALSE(parse_request(R"({"id":"1","op":"stop","handle":1})", &id));
  r = parse_request(R"({"id":5,"op":7})", &id);
  ASSERT_FALSE(r);
  EXPECT_EQ(id, 5u);  // the refusal still reaches its caller
}

TEST(BrokerRequest, RefusesAnUnknownOp) {
  std::uint64_t id = 0;
  const auto message = refusal({{"op", "exec"}, {"id", 4}, {"argv", {"/bin/sh"}}}, &id);
  EXPECT_NE(message.find("unknown op 'exec'"), std::string::npos) << message;
  EXPECT_EQ(id, 4u);
}

TEST(BrokerRequest, RefusesFieldsAnOpDoesNotHave) {
  json weaker = launch();
  weaker["jail"] = {{"network", true}};
  EXPECT_NE(refusal(weaker).find("unknown field 'jail'"), std::string::npos);
  json argv = launch();
  argv["argv"] = {"/bin/sh"};
  EXPECT_NE(refusal(argv).find("unknown field 'argv'"), std::string::npos);
  EXPECT_NE(refusal({{"op", "stop"}, {"id", 1}, {"handle", 1}, {"signal", 9}})
                .find("unknown field 'signal'"),
            std::string::npos);
}

TEST(BrokerRequest, RefusesWrongTypesAndMissingFields) {
  for (const json& bad : {
           launch("k1", "2900000"),  // uid as a string
           launch("k1", -1),         // negative
           launch("k1", 1.5),        // not an integer
           json{{"op", "launch"}, {"id", 1}, {"kernel_id", "k1"}, {"uid", 2900000}, {"env", {}}},
           json{{"op", "launch"},
                {"id", 1},
                {"kernel_id", 5},
                {"kernelspec", "python3"},
                {"uid", 2900000},
                {"env", json::object()}},
           json{{"op", "launch"},
                {"id", 1},
                {"kernel_id", "k1"},
                {"kernelspec", "python3"},
                {"uid", 2900000},
                {"env", {{"A", 1}}}},
           json{{"op", "launch"},
                {"id", 1},
                {"kernel_id", "k1"},
                {"kernelspec", "python3"},
                {"uid", 2900000},
                {"env", json::array()}},
           json{{"op", "launch"},
                {"id", 1},
                {"kernel_id", "k1"},
                {"kernelspec", "python3"},
                {"uid", 2900000},
                {"env", json::object()},
                {"conn_files", {{"a.py", 3}}}},
           json{{"op", "signal"}, {"id", 1}, {"handle", "1"}, {"signal", 2}},
           json{{"op", "signal"}, {"id", 1}, {"handle", 1}},
           json{{"op", "stop"}, {"id", 1}, {"handle", -3}},
           json{{"op", "wait_fast"}, {"id", 1}, {"timeout_ms", "5"}},
           json{{"op", "release_work"}, {"id", 1}, {"kernel_id", json::array()}},
       }) {
    SCOPED_TRACE(bad.dump());
    const std::string message = refusal(bad);
    EXPECT_FALSE(message.empty());
  }
  EXPECT_NE(refusal(launch("k1", "2900000")).find("wrong type"), std::string::npos);
}

TEST(BrokerRequest, RefusesPathsSignalsAndNamesOutsideTheRules) {
  EXPECT_NE(refusal(launch("../../etc")).find("plain name"), std::string::npos);
  EXPECT_FALSE(refusal({{"op", "release_work"}, {"id", 1}, {"kernel_id", ".."}}).empty());
  EXPECT_NE(refusal({{"op", "signal"}, {"id", 1}, {"handle", 1}, {"signal", SIGSTOP}})
                .find("not one a kernel is sent"),
            std::string::npos);
  json env = launch();
  env["env"] = {{"A=B", "x"}};
  EXPECT_FALSE(refusal(env).empty());
  json conn = launch();
  conn["conn_files"] = {{"connection.json", "{}"}};
  EXPECT_FALSE(refusal(conn).empty());
  conn["conn_files"] = {{"../x", "{}"}};
  EXPECT_FALSE(refusal(conn).empty());
}

TEST(BrokerRequest, RefusesOversizedRequests) {
  json env = launch();
  env["env"] = {{"BIG", std::string(kMaxEnvBytes + 1, 'x')}};
  EXPECT_NE(refusal(env).find("larger than 1 MiB"), std::string::npos);
  json many = launch();
  many["env"] = json::object();
  for (std::size_t i = 0; i <= kMaxEnvEntries; ++i) {
    many["env"]["V" + std::to_string(i)] = "";
  }
  EXPECT_FALSE(refusal(many).empty());
  json spec = launch();
  spec["kernelspec"] = std::string(kMaxKernelspecName + 1, 'p');
  EXPECT_FALSE(refusal(spec).empty());
  std::uint64_t id = 0;
  EXPECT_FALSE(parse_request(std::string(kMaxMessage + 1, ' '), &id));
  // Deep nesting is refused, with the id read so that the refusal reaches its caller.
  const std::string deep = "{\"id\":3,\"op\":\"stop\",\"handle\":" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  auto r = parse_request(deep, &id);
  ASSERT_FALSE(r);
  EXPECT_EQ(id, 3u);
  EXPECT_NE(r.error().message.find("nested deeper"), std::string::npos);
  // Brackets inside strings do not count.
  json brackets = launch();
  brackets["env"] = {{"A", std::string(100, '[')}};
  EXPECT_EQ(refusal(brackets), "");
}

TEST(BrokerRequest, RepliesReadBack) {
  const Error e = make_error(ErrorCode::kNotFound, "no_such_kernel", "handle 9 is no kernel");
  const json reply = json::parse(encode_error(3, e));
  EXPECT_EQ(reply["id"], 3);
  EXPECT_EQ(reply["ok"], false);
  const Error back = error_from_reply(reply);
  EXPECT_EQ(back.code, e.code);
  EXPECT_EQ(back.reason, e.reason);
  EXPECT_EQ(back.message, e.message);
  EXPECT_EQ(error_from_reply(json{{"code", 999}, {"reason", 5}}).code, ErrorCode::kInternal);
  const json ok = json::parse(encode_ok(4, {{"fast", true}}));
  EXPECT_EQ(ok["id"], 4);
  EXPECT_EQ(ok["ok"], true);
  EXPECT_EQ(ok["fast"], true);
  const json ev = json::parse(encode_exited(2, "{\"x\":1}"));
  EXPECT_EQ(ev["event"], "exited");
  EXPECT_EQ(ev["handle"], 2);
}

}  // namespace
}  // namespace cellgate::broker
