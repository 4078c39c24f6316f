// The request bodies of the agent API and the E2B API, parsed by the functions their routes call:
// http::body_object (+ check_json_depth, as the session's body parsing), execute's
// ExecuteRequest/OneShotRequest::from_json (POST /api/kernels/{id}/execute, /api/execute) and
// e2b's parse_run_code_request / parse_create_context_request (POST /execute, /contexts). Every
// input goes to all of them. Invariants:
//   - every refusal is kInvalidArgument (a 400), never another code, never an exception;
//   - what is accepted respects its limits: timeout in (0, max], files within max_file_bytes in all
//     and under normalized work-dir paths, env var names os.environ accepts, an absolute cwd.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/api/e2b.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/message.hpp"
#include "cellgate/store/files.hpp"
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
constexpr double kMaxTimeout = 600;
constexpr std::size_t kMaxFileBytes = 1024;

template <class T>
void check_refusal(const cellgate::Result<T>& r, const char* what) {
  if (!r) {
    check(r.error().code == cellgate::ErrorCode::kInvalidArgument, what, r.error().describe());
  }
}

void check_cell(const cellgate::execute::ExecuteRequest& cell) {
  check(cell.timeout_seconds > 0 && cell.timeout_seconds <= kMaxTimeout,
        "an accepted timeout outside (0, max]", std::to_string(cell.timeout_seconds));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  namespace e2b = cellgate::api::e2b;

  cellgate::http::Request req{cellgate::http::Verb::post, "/api/execute", 11};
  req.body() = std::string(text);
  auto body = cellgate::http::body_object(req);
  check_refusal(body, "body_object refused with another code");
  if (body) {
    check(body->is_object(), "body_object gave something that is not an object");
    auto cell = cellgate::execute::ExecuteRequest::from_json(*body, kMaxTimeout);
    check_refusal(cell, "ExecuteRequest::from_json refused with another code");
    if (cell) {
      check_cell(*cell);
    }
    auto once = cellgate::execute::OneShotRequest::from_json(*body, kMaxTimeout, kMaxFileBytes);
    check_refusal(once, "OneShotRequest::from_json refused with another code");
    if (once) {
      check_cell(once->cell);
      std::size_t total = 0;
      for (const auto& [path, bytes] : once->files) {
        total += bytes.size();
        check(total <= kMaxFileBytes, "accepted files over max_file_bytes in all", path);
        auto normalized = cellgate::store::files::normalize(path);
        check(normalized.ok(), "an accepted file path normalize() refuses", path);
      }
    }
  }

  auto run = e2b::parse_run_code_request(text);
  check_refusal(run, "parse_run_code_request refused with another code");
  if (run) {
    for (const auto& [name, value] : run->env_vars) {
      check(!name.empty() && name.find('=') == std::string::npos &&
                name.find('\0') == std::string::npos && value.find('\0') == std::string::npos,
            "an accepted env var os.environ would refuse", name);
    }
    (void)e2b::env_code(run->env_vars);
    (void)e2b::env_restore_code(run->env_vars);
  }
  auto ctx = e2b::parse_create_context_request(text);
  check_refusal(ctx, "parse_create_context_request refused with another code");
  if (ctx) {
    check(!ctx->cwd.empty() && ctx->cwd.front() == '/' && ctx->cwd.find('\0') == std::string::npos,
          "an accepted cwd that is not absolute", ctx->cwd);
  }
  (void)cellgate::http::check_json_depth(text);
  return 0;
}
