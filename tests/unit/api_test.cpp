// The REST API in memory: Api::handle with a KernelRegistry that never starts a kernel.
//
// Every test builds requests by hand and waits for the reply callback (which may run on the
// Api's pool). Kernelspecs come from a private JUPYTER_PATH so the results do not depend on the
// host's jupyter installation. Nothing here may start a kernel: no request below names an
// existing kernelspec together with valid arguments.
#include "cellgate/api/api.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/testing/api_parts.hpp"

namespace cellgate::api {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using http::Request;
using http::Response;
using http::Target;
using nlohmann::json;
namespace bhttp = boost::beast::http;

constexpr const char* kToken = "s3cret-T0ken";
constexpr const char* kUnknownId = "0b8e4c1a-2f6d-4e7a-9c3b-5d1f0a2e4b6c";
constexpr const char* kHost = "127.0.0.1:8888";

// The first bytes of a PNG, and some more: enough to tell the file was served as it is.
const std::string kLogoBytes = std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16) + "cellgate-logo";

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "cellgate-api-test-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp failed";
  return pattern;
}

// A jupyter data dir with a complete python3 spec (logos, a hidden file, a subdirectory) and a
// minimal one (argv only).
void write_kernelspecs(const fs::path& jupyter_dir) {
  const fs::path python3 = jupyter_dir / "kernels" / "python3";
  write_file(python3 / "kernel.json", R"json({
    "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "Python 3 (ipykernel)",
    "language": "python",
    "metadata": {"debugger": true}
  })json");
  write_file(python3 / "logo-64x64.png", kLogoBytes);
  write_file(python3 / "logo-32x32.png", kLogoBytes);
  write_file(python3 / ".hidden", "secret");
  fs::create_directories(python3 / "subdir");
  write_file(jupyter_dir / "kernels" / "minimal" / "kernel.json",
             R"({"argv": ["/usr/bin/python3", "-f", "{connection_file}"]})");
}

using TestOptions = testing::ApiPartsOptions;

// The Api under test and the parts it runs on.
struct Gateway {
  explicit Gateway(TestOptions o, std::string token = kToken)
      : parts([&] {
          o.token = std::move(token);
          return o;
        }()),
        api(parts.api) {}
  testing::ApiParts parts;
  Api& api;
};

Request make_request(bhttp::verb verb, const std::string& target, const std::string& token = kToken,
                     const std::string& body = "") {
  Request req{verb, target, 11};
  req.set(bhttp::field::host, kHost);
  if (!token.empty()) {
    req.set(bhttp::field::authorization, "token " + token);
  }
  if (!body.empty()) {
    req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  return req;
}

Request anonymous(bhttp::verb verb, const std::string& target, const std::string& body = "") {
  return make_request(verb, target, "", body);
}

// Runs a request and waits for its one reply.
Response call(Api& api, Request req) {
  auto promise = std::make_shared<std::promise<Response>>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto future = promise->get_future();
  api.handle(std::move(req), [promise, calls](Response res) {
    if (calls->fetch_add(1) == 0) {
      promise->set_value(std::move(res));
    } else {
      ADD_FAILURE() << "reply called more than once";
    }
  });
  if (future.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "no reply within 10 s";
    return Response{};
  }
  return future.get();
}

json body_json(const Response& res) {
  json j = json::parse(res.body(), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << res.body();
  return j;
}

std::string header(const Response& res, bhttp::field field) {
  auto it = res.find(field);
  return it == res.end() ? std::string() : std::string(it->value());
}

bool has_header(const Response& res, bhttp::field field) {
  return res.find(field) != res.end();
}

// Checks a JSON error: the status, the content type and {"reason", "message"} strings.
json expect_error(const Response& res, int status) {
  EXPECT_EQ(res.result_int(), static_cast<unsigned>(status)) << res.body();
  EXPECT_EQ(header(res, bhttp::field::content_type), "application/json");
  json j = body_json(res);
  if (!j.is_object()) {
    ADD_FAILURE() << "error body is not an object: " << res.body();
    return j;
  }
  EXPECT_TRUE(j.contains("reason") && j["reason"].is_string()) << res.body();
  EXPECT_TRUE(j.contains("message") && j["message"].is_string()) << res.body();
  EXPECT_FALSE(j.value("message", "").empty()) << res.body();
  return j;
}

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = make_temp_dir();
    write_kernelspecs(fs::path(root_) / "jupyter");
    if (const char* old = std::getenv("JUPYTER_PATH")) {
      saved_jupyter_path_ = old;
    }
    ::setenv("JUPYTER_PATH", (root_ + "/jupyter").c_str(), 1);
    gateway_ = std::make_unique<Gateway>(base_options());
  }

  void TearDown() override {
    gateway_.reset();
    if (saved_jupyter_path_) {
      ::setenv("JUPYTER_PATH", saved_jupyter_path_->c_str(), 1);
    } else {
      ::unsetenv("JUPYTER_PATH");
    }
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  TestOptions base_options() const {
    TestOptions o;
    o.state_dir = root_ + "/state";
    o.token = kToken;
    return o;
  }

  Response get(const std::string& target) {
    return call(gateway_->api, make_request(bhttp::verb::get, target));
  }
  Response send(bhttp::verb verb, const std::string& target, const std::string& body = "") {
    return call(gateway_->api, make_request(verb, target, kToken, body));
  }

  std::string root_;
  std::optional<std::string> saved_jupyter_path_;
  std::unique_ptr<Gateway> gateway_;
};

// ---- authentication --------------------------------------------------------------------------

TEST_F(ApiTest, VersionIsOpenWithoutAToken) {
  Response res = call(gateway_->api, anonymous(bhttp::verb::get, "/api"));
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(header(res, bhttp::field::content_type), "application/json");
  json j = body_json(res);
  ASSERT_TRUE(j.contains("version")) << res.body();
  EXPECT_TRUE(j["version"].is_string());
  EXPECT_FALSE(j["version"].get<std::string>().empty());
}

TEST_F(ApiTest, EveryOtherRouteWithoutATokenIs401) {
  const std::vector<std::pair<bhttp::verb, std::string>> routes = {
      {bhttp::verb::get, "/api/kernels"},
      {bhttp::verb::post, "/api/kernels"},
      {bhttp::verb::get, std::string("/api/kernels/") + kUnknownId},
      {bhttp::verb::delete_, std::string("/api/kernels/") + kUnknownId},
      {bhttp::verb::post, std::string("/api/kernels/") + kUnknownId + "/interrupt"},
      {bhttp::verb::post, std::string("/api/kernels/") + kUnknownId + "/restart"},
      {bhttp::verb::get, "/api/sessions"},
      {bhttp::verb::post, "/api/sessions"},
      {bhttp::verb::get, std::string("/api/sessions/") + kUnknownId},
      {bhttp::verb::get, "/api/kernelspecs"},
      {bhttp::verb::get, "/api/kernelspecs/python3"},
      {bhttp::verb::get, "/kernelspecs/python3/logo-64x64.png"},
      {bhttp::verb::post, "/api"},
      {bhttp::verb::get, "/api/no-such-route"},
  };
  for (const auto& [verb, target] : routes) {
    SCOPED_TRACE(std::string(bhttp::to_string(verb)) + " " + target);
    Response res = call(gateway_->api, anonymous(verb, target));
    expect_error(res, 401);
  }
}

TEST_F(ApiTest, WrongTokenIs403) {
  for (const std::string& target :
       std::vector<std::string>{"/api/kernels", "/api/kernelspecs", "/api/sessions"}) {
    SCOPED_TRACE(target);
    expect_error(call(gateway_->api, make_request(bhttp::verb::get, target, "not-the-token")), 403);
    expect_error(call(gateway_->api, anonymous(bhttp::verb::get, target + "?token=nope")), 403);
  }
  // A prefix of the token is not the token.
  expect_error(call(gateway_->api, make_request(bhttp::verb::get, "/api/kernels", "s3cret")), 403);
}

TEST_F(ApiTest, TokenHeaderBearerAndQueryAreAccepted) {
  {
    Request req = anonymous(bhttp::verb::get, "/api/kernels");
    req.set(bhttp::field::authorization, std::string("token ") + kToken);
    EXPECT_EQ(call(gateway_->api, std::move(req)).result_int(), 200u);
  }
  {
    Request req = anonymous(bhttp::verb::get, "/api/kernels");
    req.set(bhttp::field::authorization, std::string("Bearer ") + kToken);
    EXPECT_EQ(call(gateway_->api, std::move(req)).result_int(), 200u);
  }
  {
    Request req = anonymous(bhttp::verb::get, "/api/kernels");
    req.set(bhttp::field::authorization, std::string("Token ") + kToken);
    EXPECT_EQ(call(gateway_->api, std::move(req)).result_int(), 200u) << "scheme is case-blind";
  }
  EXPECT_EQ(
      call(gateway_->api, anonymous(bhttp::verb::get, std::string("/api/kernels?token=") + kToken))
          .result_int(),
      200u);
  {
    // GatewayClient without a configured token still sends "Authorization: token ".
    Request req = anonymous(bhttp::verb::get, std::string("/api/kernels?token=") + kToken);
    req.set(bhttp::field::authorization, "token ");
    EXPECT_EQ(call(gateway_->api, std::move(req)).result_int(), 200u);
  }
  {
    Request req = anonymous(bhttp::verb::get, "/api/kernels");
    req.set(bhttp::field::authorization, "Basic dXNlcjpwYXNz");
    expect_error(call(gateway_->api, std::move(req)), 401);
  }
}

TEST_F(ApiTest, NoTokenConfiguredAllowsEverything) {
  Gateway open(base_options(), "");
  EXPECT_EQ(call(open.api, anonymous(bhttp::verb::get, "/api/kernels")).result_int(), 200u);
}

// ---- routing ---------------------------------------------------------------------------------

TEST_F(ApiTest, UnknownRoutesAre404Json) {
  for (const std::string& target :
       std::vector<std::string>{"/api/nope", "/nope", "/", "/api/kernels/a/b/c/d",
                                "/kernelspecs/python3", "/api/kernelspecs/python3/extra"}) {
    SCOPED_TRACE(target);
    json j = expect_error(get(target), 404);
    EXPECT_EQ(j.value("reason", ""), "Not Found");
  }
}

TEST_F(ApiTest, UnknownQueryParametersAreIgnored) {
  Response res = get("/api/kernels?1712345678901");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(body_json(res), json::array());
  res = call(gateway_->api, anonymous(bhttp::verb::get, std::string("/api/kernels?1712345678901&"
                                                                    "token=") +
                                                            kToken));
  EXPECT_EQ(res.result_int(), 200u) << res.body();
  res = get("/api/kernelspecs?user=alice&_=1");
  EXPECT_EQ(res.result_int(), 200u) << res.body();
}

TEST_F(ApiTest, KernelListStartsEmpty) {
  Response res = get("/api/kernels");
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(header(res, bhttp::field::content_type), "application/json");
  EXPECT_EQ(res.body(), "[]");
}

TEST_F(ApiTest, UnknownKernelIs404WithJupytersMessage) {
  json j = expect_error(get(std::string("/api/kernels/") + kUnknownId), 404);
  EXPECT_EQ(j.value("message", ""), std::string("Kernel does not exist: ") + kUnknownId);
}

TEST_F(ApiTest, DeleteInterruptRestartOfAnUnknownKernelAre404) {
  const std::string base = std::string("/api/kernels/") + kUnknownId;
  json j = expect_error(send(bhttp::verb::delete_, base), 404);
  EXPECT_NE(j.value("message", "").find(kUnknownId), std::string::npos);
  j = expect_error(send(bhttp::verb::post, base + "/interrupt"), 404);
  EXPECT_NE(j.value("message", "").find("Kernel does not exist"), std::string::npos);
  j = expect_error(send(bhttp::verb::post, base + "/restart"), 404);
  EXPECT_NE(j.value("message", "").find("Kernel does not exist"), std::string::npos);
  // GatewayClient sends {} as the body of interrupt and restart.
  expect_error(send(bhttp::verb::post, base + "/restart", "{}"), 404);
}

TEST_F(ApiTest, StartRejectsBadBodiesWithoutStartingAKernel) {
  json j = expect_error(send(bhttp::verb::post, "/api/kernels", "{\"name\": "), 400);
  EXPECT_NE(j.value("message", "").find("JSON"), std::string::npos) << j.dump();
  expect_error(send(bhttp::verb::post, "/api/kernels", "[\"python3\"]"), 400);
  expect_error(send(bhttp::verb::post, "/api/kernels", "\"python3\""), 400);
  expect_error(send(bhttp::verb::post, "/api/kernels", R"({"name": 3})"), 400);
  j = expect_error(send(bhttp::verb::post, "/api/kernels", R"({"name": "python3", "env": "x"})"),
                   400);
  EXPECT_NE(j.value("message", "").find("env"), std::string::npos) << j.dump();
  expect_error(send(bhttp::verb::post, "/api/kernels", R"({"env": {"KERNEL_USERNAME": 7}})"), 400);
  expect_error(send(bhttp::verb::post, "/api/kernels", R"({"env": {"KERNEL_X": "line\nbreak"}})"),
               400);
  expect_error(send(bhttp::verb::post, "/api/kernels", R"({"name": "../python3"})"), 400);
  EXPECT_EQ(body_json(get("/api/kernels")), json::array()) << "a kernel was started";
}

TEST_F(ApiTest, StartWithAnUnknownKernelspecIs404AndSaysSo) {
  json j =
      expect_error(send(bhttp::verb::post, "/api/kernels", R"({"name": "no-such-kernel"})"), 404);
  EXPECT_NE(j.value("message", "").find("no-such-kernel"), std::string::npos) << j.dump();
  EXPECT_NE(j.value("message", "").find("kernelspec"), std::string::npos) << j.dump();
  EXPECT_EQ(body_json(get("/api/kernels")), json::array());
}

TEST_F(ApiTest, WrongMethodIs405) {
  json j = expect_error(send(bhttp::verb::put, "/api/kernels"), 405);
  EXPECT_EQ(j.value("reason", ""), "Method Not Allowed");
  expect_error(send(bhttp::verb::patch, "/api/kernels"), 405);
  expect_error(send(bhttp::verb::put, std::string("/api/kernels/") + kUnknownId), 405);
  expect_error(send(bhttp::verb::delete_, "/api/kernelspecs"), 405);
  expect_error(send(bhttp::verb::post, "/api/kernelspecs/python3"), 405);
}

TEST_F(ApiTest, WrongMethodOnSessionsListIs405) {
  // Regression (found by this test, fixed): sessions() sends every method other than GET/POST on
  // /api/sessions to its "no such route" branch, so PUT /api/sessions is 404 where /api/kernels
  // answers 405.
  expect_error(send(bhttp::verb::put, "/api/sessions"), 405);
}

TEST_F(ApiTest, ChannelsWithoutAnUpgradeIs400) {
  expect_error(get(std::string("/api/kernels/") + kUnknownId + "/channels"), 400);
}

// ---- sessions --------------------------------------------------------------------------------

TEST_F(ApiTest, SessionsNeedPathAndType) {
  expect_error(send(bhttp::verb::post, "/api/sessions", "{}"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions", R"({"path": "a.ipynb"})"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions", R"({"type": "notebook"})"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions", R"({"path": 1, "type": "notebook"})"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions", "{not json"), 400);
  expect_error(send(bhttp::verb::post, "/api/sessions",
                    R"({"path": "a.ipynb", "type": "notebook", "kernel": "python3"})"),
               400);
  EXPECT_EQ(body_json(get("/api/sessions")), json::array());
}

TEST_F(ApiTest, SessionForAnUnknownKernelOrSpecIsRefused) {
  json j = expect_error(
      send(
          bhttp::verb::post, "/api/sessions",
          json{{"path", "a.ipynb"}, {"type", "notebook"}, {"kernel", {{"id", kUnknownId}}}}.dump()),
      404);
  EXPECT_NE(j.value("message", "").find(kUnknownId), std::string::npos);
  j = expect_error(send(bhttp::verb::post, "/api/sessions",
                        R"({"path": "a.ipynb", "type": "notebook",
                            "kernel": {"name": "no-such-kernel"}})"),
                   404);
  EXPECT_NE(j.value("message", "").find("no-such-kernel"), std::string::npos);
  EXPECT_EQ(body_json(get("/api/sessions")), json::array());
  EXPECT_EQ(body_json(get("/api/kernels")), json::array());
}

TEST_F(ApiTest, SessionListStartsEmptyAndUnknownSessionsAre404) {
  Response res = get("/api/sessions");
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res.body(), "[]");
  const std::string target = std::string("/api/sessions/") + kUnknownId;
  json j = expect_error(get(target), 404);
  EXPECT_NE(j.value("message", "").find(kUnknownId), std::string::npos);
  expect_error(send(bhttp::verb::delete_, target), 404);
  expect_error(send(bhttp::verb::patch, target, R"({"path": "b.ipynb"})"), 404);
}

// ---- kernelspecs -----------------------------------------------------------------------------

// JupyterLab's kernelspec/validate.ts rules (reference §3.3), plus the resource URL shape.
void expect_valid_spec(const json& spec, const std::string& name, const std::string& base = "") {
  SCOPED_TRACE(spec.dump());
  ASSERT_TRUE(spec.is_object());
  ASSERT_TRUE(spec.contains("name") && spec["name"].is_string());
  EXPECT_EQ(spec["name"], name);
  ASSERT_TRUE(spec.contains("resources"));
  EXPECT_TRUE(spec["resources"].is_object());
  ASSERT_TRUE(spec.contains("spec") && spec["spec"].is_object());
  const json& s = spec["spec"];
  EXPECT_TRUE(s.contains("argv") && s["argv"].is_array());
  EXPECT_TRUE(s.contains("display_name") && s["display_name"].is_string());
  EXPECT_TRUE(s.contains("language") && s["language"].is_string());
  if (s.contains("metadata")) {
    EXPECT_TRUE(s["metadata"].is_object());
  }
  if (s.contains("env")) {
    EXPECT_TRUE(s["env"].is_object());
  }
  if (s.contains("interrupt_mode")) {
    EXPECT_TRUE(s["interrupt_mode"].is_string());
  }
  for (const auto& [key, url] : spec["resources"].items()) {
    ASSERT_TRUE(url.is_string()) << key;
    EXPECT_EQ(url.get<std::string>().rfind(base + "/kernelspecs/" + name + "/", 0), 0u)
        << key << ": " << url;
  }
}

TEST_F(ApiTest, KernelspecsListsTheDefaultAndValidModels) {
  Response res = get("/api/kernelspecs");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  json j = body_json(res);
  EXPECT_EQ(j.value("default", ""), "python3");
  ASSERT_TRUE(j.contains("kernelspecs") && j["kernelspecs"].is_object()) << res.body();
  ASSERT_TRUE(j["kernelspecs"].contains("python3")) << res.body();
  ASSERT_TRUE(j["kernelspecs"].contains("minimal")) << res.body();
  for (const auto& [name, spec] : j["kernelspecs"].items()) {
    expect_valid_spec(spec, name);
  }
  const json& python3 = j["kernelspecs"]["python3"];
  EXPECT_EQ(python3["spec"]["language"], "python");
  EXPECT_EQ(python3["spec"]["argv"].size(), 5u);
  EXPECT_NE(python3["spec"]["display_name"].get<std::string>().find("Python 3"), std::string::npos);
  // Jailed, JupyterLab is told no debugger: debugpy needs the loopback network, which only a
  // kernelspec with metadata.cellgate.debugger on a gateway with --allow-debugger gets.
  EXPECT_EQ(python3["spec"]["metadata"], json({{"debugger", false}}));
  EXPECT_EQ(python3["resources"].value("logo-64x64", ""), "/kernelspecs/python3/logo-64x64.png");
  EXPECT_EQ(python3["resources"].value("logo-32x32", ""), "/kernelspecs/python3/logo-32x32.png");
  EXPECT_FALSE(python3["resources"].contains("logo-svg")) << "no such file in the spec";
}

TEST_F(ApiTest, OneKernelspecAndAnUnknownOne) {
  Response res = get("/api/kernelspecs/python3");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  expect_valid_spec(body_json(res), "python3");
  json j = expect_error(get("/api/kernelspecs/no-such-kernel"), 404);
  EXPECT_NE(j.value("message", "").find("no-such-kernel"), std::string::npos);
  const unsigned bad_name = get("/api/kernelspecs/..%2Fpython3").result_int();
  EXPECT_TRUE(bad_name == 400u || bad_name == 404u) << bad_name;
}

TEST_F(ApiTest, AMalformedKernelspecDoesNotBreakTheList) {
  // Regression (found by this test, fixed): KernelSpec::load reads display_name and language with
  // json::value(), which throws nlohmann::json::type_error when kernel.json has them with another
  // type; the exception escapes KernelRegistry::kernelspecs() and Api::handle, so one bad
  // kernel.json anywhere in the kernelspec path makes GET /api/kernelspecs throw (on a server I/O
  // thread: std::terminate). Fix: check the types (is_string) in load() and skip specs that fail to
  // load.
  write_file(fs::path(root_) / "bad" / "kernels" / "broken" / "kernel.json",
             R"({"argv": ["/bin/true"], "display_name": 5, "language": ["x"]})");
  ::setenv("JUPYTER_PATH", (root_ + "/bad:" + root_ + "/jupyter").c_str(), 1);
  Response res;
  EXPECT_NO_THROW(res = get("/api/kernelspecs"));
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  json j = body_json(res);
  EXPECT_TRUE(j["kernelspecs"].contains("python3"));
  EXPECT_FALSE(j["kernelspecs"].contains("broken"));
}

TEST_F(ApiTest, KernelspecLogoIsServedAsPng) {
  Response res = get("/kernelspecs/python3/logo-64x64.png");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(header(res, bhttp::field::content_type), "image/png");
  EXPECT_EQ(res.body(), kLogoBytes);
  EXPECT_EQ(header(res, bhttp::field::content_length), std::to_string(kLogoBytes.size()));
  Response head = send(bhttp::verb::head, "/kernelspecs/python3/logo-64x64.png");
  EXPECT_EQ(head.result_int(), 200u);
  EXPECT_TRUE(head.body().empty());
  expect_error(get("/kernelspecs/python3/logo-svg.svg"), 404);
  expect_error(get("/kernelspecs/no-such-kernel/logo-64x64.png"), 404);
}

TEST_F(ApiTest, KernelspecFilesCannotEscapeOrShowHiddenFiles) {
  for (const std::string& target : std::vector<std::string>{
           "/kernelspecs/python3/../kernel.json", "/kernelspecs/python3/.hidden",
           "/kernelspecs/python3/%2Ehidden", "/kernelspecs/python3/..",
           "/kernelspecs/python3/%2e%2e%2fminimal%2fkernel.json",
           "/kernelspecs/python3/..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
           "/kernelspecs/python3/%2Fetc%2Fpasswd", "/kernelspecs/..%2Fjupyter/kernels",
           "/kernelspecs/../python3/logo-64x64.png", "/kernelspecs/./python3"}) {
    SCOPED_TRACE(target);
    Response res = get(target);
    expect_error(res, 404);
    EXPECT_EQ(res.body().find("secret"), std::string::npos);
  }
}

TEST_F(ApiTest, KernelspecDirectoryIsNotAFile) {
  // Regression (found by this test, fixed): kernelspec_file opens the path with std::ifstream,
  // which succeeds on a directory on Linux; reading it through istreambuf_iterator then throws
  // std::ios_base::failure ("Is a directory") out of Api::handle, which on a server thread ends the
  // process. Fix: answer 404 unless fs::is_regular_file, and catch exceptions around the read.
  Response res;
  EXPECT_NO_THROW(res = get("/kernelspecs/python3/subdir"));
  expect_error(res, 404);
}

TEST_F(ApiTest, KernelspecFilesOnlyAnswerGetAndHead) {
  // Regression (found by this test, fixed): kernelspec_file never looks at the method:
  // DELETE/POST/PUT of a resource file answer 200 with the file. jupyter_server's handler allows
  // GET and HEAD only (405 otherwise).
  expect_error(send(bhttp::verb::delete_, "/kernelspecs/python3/logo-64x64.png"), 405);
  expect_error(send(bhttp::verb::post, "/kernelspecs/python3/logo-64x64.png"), 405);
}

// ---- CORS and origins ------------------------------------------------------------------------

class ApiCorsTest : public ApiTest {
 protected:
  void SetUp() override {
    ApiTest::SetUp();
    TestOptions o = base_options();
    o.allow_origins = {"http://lab.example"};
    gateway_ = std::make_unique<Gateway>(o);
  }
  Response with_origin(bhttp::verb verb, const std::string& target, const std::string& origin,
                       const std::string& token = kToken) {
    Request req = make_request(verb, target, token);
    req.set(bhttp::field::origin, origin);
    return call(gateway_->api, std::move(req));
  }
};

TEST_F(ApiCorsTest, PreflightFromAnAllowedOriginIs204WithCorsHeaders) {
  Request req = anonymous(bhttp::verb::options, "/api/kernels");
  req.set(bhttp::field::origin, "http://lab.example");
  req.set(bhttp::field::access_control_request_method, "POST");
  req.set(bhttp::field::access_control_request_headers, "authorization, content-type");
  Response res = call(gateway_->api, std::move(req));
  EXPECT_EQ(res.result_int(), 204u);
  EXPECT_TRUE(res.body().empty());
  EXPECT_EQ(header(res, bhttp::field::access_control_allow_origin), "http://lab.example");
  const std::string methods = header(res, bhttp::field::access_control_allow_methods);
  EXPECT_NE(methods.find("POST"), std::string::npos) << methods;
  EXPECT_NE(methods.find("DELETE"), std::string::npos) << methods;
  const std::string headers = header(res, bhttp::field::access_control_allow_headers);
  EXPECT_NE(headers.find("authorization"), std::string::npos) << headers;
  EXPECT_NE(headers.find("content-type"), std::string::npos) << headers;
}

TEST_F(ApiCorsTest, PreflightFromAnotherOriginGetsNoCorsHeaders) {
  Request req = anonymous(bhttp::verb::options, "/api/kernels");
  req.set(bhttp::field::origin, "http://evil.example");
  req.set(bhttp::field::access_control_request_method, "POST");
  Response res = call(gateway_->api, std::move(req));
  EXPECT_NE(res.result_int(), 204u);
  EXPECT_EQ(res.result_int(), 403u);
  EXPECT_FALSE(has_header(res, bhttp::field::access_control_allow_origin));
  EXPECT_FALSE(has_header(res, bhttp::field::access_control_allow_methods));
  EXPECT_FALSE(has_header(res, bhttp::field::access_control_allow_headers));
}

TEST_F(ApiCorsTest, AllowedOriginGetsCorsHeadersOnAnswersAndErrors) {
  Response res = with_origin(bhttp::verb::get, "/api/kernels", "http://lab.example");
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(header(res, bhttp::field::access_control_allow_origin), "http://lab.example");
  // The browser must be able to read a refusal too.
  res = with_origin(bhttp::verb::get, "/api/kernels", "http://lab.example", "");
  expect_error(res, 401);
  EXPECT_EQ(header(res, bhttp::field::access_control_allow_origin), "http://lab.example");
  res = with_origin(bhttp::verb::get, std::string("/api/kernels/") + kUnknownId,
                    "http://lab.example");
  expect_error(res, 404);
  EXPECT_EQ(header(res, bhttp::field::access_control_allow_origin), "http://lab.example");
}

TEST_F(ApiCorsTest, DisallowedOriginIs403EvenWithTheToken) {
  for (const std::string& origin :
       std::vector<std::string>{"http://evil.example", "http://lab.example.evil.example",
                                "https://lab.example", "null"}) {
    SCOPED_TRACE(origin);
    Response res = with_origin(bhttp::verb::get, "/api/kernels", origin);
    expect_error(res, 403);
    EXPECT_FALSE(has_header(res, bhttp::field::access_control_allow_origin));
  }
  expect_error(with_origin(bhttp::verb::get, "/api", "http://evil.example", ""), 403);
}

TEST_F(ApiCorsTest, SameOriginIsAllowed) {
  Response res = with_origin(bhttp::verb::get, "/api/kernels", std::string("http://") + kHost);
  EXPECT_EQ(res.result_int(), 200u) << res.body();
  res = with_origin(bhttp::verb::get, "/api/kernels", "http://127.0.0.1:9999");
  expect_error(res, 403);
}

TEST_F(ApiTest, NoAllowedOriginsMeansNoCorsHeaders) {
  Request req = make_request(bhttp::verb::get, "/api/kernels");
  req.set(bhttp::field::origin, std::string("http://") + kHost);
  Response res = call(gateway_->api, std::move(req));
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_FALSE(has_header(res, bhttp::field::access_control_allow_origin));
  Request other = make_request(bhttp::verb::get, "/api/kernels");
  other.set(bhttp::field::origin, "http://lab.example");
  expect_error(call(gateway_->api, std::move(other)), 403);
}

// ---- base_url --------------------------------------------------------------------------------

class ApiBaseUrlTest : public ApiTest {
 protected:
  void SetUp() override {
    ApiTest::SetUp();
    TestOptions o = base_options();
    o.base_url = "/prefix/";
    gateway_ = std::make_unique<Gateway>(o);
  }
};

TEST_F(ApiBaseUrlTest, RoutesLiveUnderThePrefixOnly) {
  Response res = get("/prefix/api/kernels");
  EXPECT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(res.body(), "[]");
  EXPECT_EQ(call(gateway_->api, anonymous(bhttp::verb::get, "/prefix/api")).result_int(), 200u);
  expect_error(get("/api/kernels"), 404);
  expect_error(get("/api/kernelspecs"), 404);
  expect_error(call(gateway_->api, anonymous(bhttp::verb::get, "/api")), 404);
  expect_error(get("/kernelspecs/python3/logo-64x64.png"), 404);
  res = get("/prefix/kernelspecs/python3/logo-64x64.png");
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res.body(), kLogoBytes);
  json j = expect_error(get(std::string("/prefix/api/kernels/") + kUnknownId), 404);
  EXPECT_NE(j.value("message", "").find("Kernel does not exist"), std::string::npos);
}

TEST_F(ApiBaseUrlTest, ResourceUrlsCarryThePrefix) {
  Response res = get("/prefix/api/kernelspecs");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  json j = body_json(res);
  expect_valid_spec(j["kernelspecs"]["python3"], "python3", "/prefix");
  EXPECT_EQ(j["kernelspecs"]["python3"]["resources"].value("logo-64x64", ""),
            "/prefix/kernelspecs/python3/logo-64x64.png");
}

TEST_F(ApiBaseUrlTest, APathThatOnlyStartsWithThePrefixTextIs404) {
  // Regression (found by this test, fixed): Api::handle strips base_ with rfind(base_, 0) == 0 and
  // no segment check, so with base_url /prefix/ the path "/prefixapi/kernels" becomes "api/kernels"
  // and is served (200). Fix: accept only a path equal to base_ or continuing with '/' after it.
  expect_error(get("/prefixapi/kernels"), 404);
  expect_error(call(gateway_->api, anonymous(bhttp::verb::get, "/prefixapi")), 404);
}

// ---- Target::parse ---------------------------------------------------------------------------

TEST(ApiTarget, SplitsPathAndDecodesTheQuery) {
  Target t = Target::parse("/api/kernels/a%20b?x=1+2&y=%41%42%2f&flag&=ignored&k=a%3Db&e=");
  EXPECT_EQ(t.path, "/api/kernels/a%20b") << "the path is decoded per segment, later";
  EXPECT_EQ(t.query.size(), 5u);
  EXPECT_EQ(t.query["x"], "1 2");
  EXPECT_EQ(t.query["y"], "AB/");
  EXPECT_EQ(t.query["flag"], "");
  EXPECT_EQ(t.query["k"], "a=b");
  EXPECT_EQ(t.query["e"], "");
  EXPECT_EQ(t.query.count(""), 0u);
}

TEST(ApiTarget, KeysAreDecodedAndBadEscapesKept) {
  Target t = Target::parse("/p?to%6Ben=abc%2Bdef&bad=%zz%4&plus=%2B+&last=%41");
  EXPECT_EQ(t.query["token"], "abc+def");
  EXPECT_EQ(t.query["bad"], "%zz%4");
  EXPECT_EQ(t.query["plus"], "+ ");
  EXPECT_EQ(t.query["last"], "A");
}

TEST(ApiTarget, NoQueryAndEmptyQuery) {
  Target t = Target::parse("/api");
  EXPECT_EQ(t.path, "/api");
  EXPECT_TRUE(t.query.empty());
  t = Target::parse("/api?");
  EXPECT_EQ(t.path, "/api");
  EXPECT_TRUE(t.query.empty());
  t = Target::parse("/api/kernels?1712345678901");
  EXPECT_EQ(t.path, "/api/kernels");
  EXPECT_EQ(t.query.count("1712345678901"), 1u);
  t = Target::parse("/a+b?&&x=1&&");
  EXPECT_EQ(t.path, "/a+b");
  EXPECT_EQ(t.query.size(), 1u);
  EXPECT_EQ(t.query["x"], "1");
}

// ---- WebSocket upgrade checks ----------------------------------------------------------------

Request upgrade_request(const std::string& target, const std::string& token = "") {
  Request req = make_request(bhttp::verb::get, target, token);
  req.set(bhttp::field::connection, "Upgrade");
  req.set(bhttp::field::upgrade, "websocket");
  req.set(bhttp::field::sec_websocket_version, "13");
  req.set(bhttp::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
  return req;
}

TEST_F(ApiTest, ChannelsRefusesMissingAndBadTokens) {
  const std::string target = std::string("/api/kernels/") + kUnknownId + "/channels";
  auto check = gateway_->api.upgrade(upgrade_request(target + "?session_id=s1"));
  EXPECT_FALSE(check.handler);
  ASSERT_TRUE(check.refusal);
  expect_error(*check.refusal, 401);

  check = gateway_->api.upgrade(upgrade_request(target + "?token=wrong"));
  EXPECT_FALSE(check.handler);
  ASSERT_TRUE(check.refusal);
  expect_error(*check.refusal, 403);

  check = gateway_->api.upgrade(upgrade_request(target, "wrong"));
  ASSERT_TRUE(check.refusal);
  expect_error(*check.refusal, 403);
}

TEST_F(ApiTest, ChannelsOfAnUnknownKernelIs404) {
  const std::string target = std::string("/api/kernels/") + kUnknownId + "/channels";
  auto check = gateway_->api.upgrade(
      upgrade_request(target + "?session_id=s1&token=" + std::string(kToken)));
  EXPECT_FALSE(check.handler);
  ASSERT_TRUE(check.refusal);
  json j = expect_error(*check.refusal, 404);
  EXPECT_EQ(j.value("message", ""), std::string("Kernel does not exist: ") + kUnknownId);
  check = gateway_->api.upgrade(upgrade_request(target, kToken));
  ASSERT_TRUE(check.refusal);
  expect_error(*check.refusal, 404);
}

TEST_F(ApiTest, ChannelsOnAnotherPathIs404) {
  const std::string kernel = std::string("/api/kernels/") + kUnknownId;
  for (const std::string& target :
       {kernel + "/shell", kernel, kernel + "/channels/x", std::string("/api/kernels/channels"),
        std::string("/api/sessions/") + kUnknownId + "/channels", std::string("/channels")}) {
    SCOPED_TRACE(target);
    auto check = gateway_->api.upgrade(upgrade_request(target, kToken));
    EXPECT_FALSE(check.handler);
    ASSERT_TRUE(check.refusal);
    json j = expect_error(*check.refusal, 404);
    EXPECT_NE(j.value("message", "").find("no WebSocket route"), std::string::npos) << j.dump();
  }
}

TEST_F(ApiCorsTest, ChannelsFromADisallowedOriginIs403) {
  Request req = upgrade_request(std::string("/api/kernels/") + kUnknownId + "/channels", kToken);
  req.set(bhttp::field::origin, "http://evil.example");
  auto check = gateway_->api.upgrade(req);
  EXPECT_FALSE(check.handler);
  ASSERT_TRUE(check.refusal);
  expect_error(*check.refusal, 403);
}

TEST_F(ApiBaseUrlTest, ChannelsUnderThePrefixReachTheKernelLookup) {
  auto check = gateway_->api.upgrade(
      upgrade_request(std::string("/prefix/api/kernels/") + kUnknownId + "/channels", kToken));
  ASSERT_TRUE(check.refusal);
  json j = expect_error(*check.refusal, 404);
  EXPECT_NE(j.value("message", "").find("Kernel does not exist"), std::string::npos) << j.dump();
}

TEST_F(ApiBaseUrlTest, ChannelsOutsideThePrefixIs404) {
  // Regression (found by this test, fixed): check_channels strips base_ only when the path starts
  // with it and otherwise routes the bare path, so with base_url /prefix/ a WebSocket to
  // /api/kernels/{id}/channels (no prefix) reaches the kernel lookup and, for a live kernel,
  // upgrades — while handle() 404s the same path. (It shares the missing segment check of handle():
  // "/prefixapi/kernels/{id}/channels" is accepted too.) Fix: refuse with 404 unless the path is
  // under base_ + '/'.
  auto check = gateway_->api.upgrade(
      upgrade_request(std::string("/api/kernels/") + kUnknownId + "/channels", kToken));
  ASSERT_TRUE(check.refusal);
  json j = expect_error(*check.refusal, 404);
  EXPECT_NE(j.value("message", "").find("no WebSocket route"), std::string::npos) << j.dump();
}

}  // namespace
}  // namespace cellgate::api
