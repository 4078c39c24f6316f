// ExecuteRequest and OneShotRequest: the bodies of POST /api/kernels/{id}/execute and
// POST /api/execute, checked (every field's type, the timeout capped, file paths normalized).
#include <algorithm>
#include <string>

#include "cellgate/execute/executor.hpp"
#include "cellgate/store/files.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::execute {
namespace {

using nlohmann::json;

Error bad(const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "bad_request", what);
}

}  // namespace

Result<ExecuteRequest> ExecuteRequest::from_json(const json& body, double max_timeout) {
  if (!body.is_object()) {
    return bad("the request body must be a JSON object");
  }
  ExecuteRequest r;
  auto code = body.find("code");
  if (code == body.end() || !code->is_string()) {
    return bad("'code' (a string) is required");
  }
  r.code = code->get<std::string>();
  if (auto t = body.find("timeout"); t != body.end() && !t->is_null()) {
    if (!t->is_number() || t->get<double>() <= 0) {
      return bad("'timeout' must be a positive number of seconds");
    }
    r.timeout_seconds = std::min(t->get<double>(), max_timeout);
  }
  if (auto s = body.find("stdin"); s != body.end() && !s->is_null()) {
    if (s->is_string()) {
      r.stdin_lines.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& line : *s) {
        if (!line.is_string()) {
          return bad("'stdin' must be a string or an array of strings");
        }
        r.stdin_lines.push_back(line.get<std::string>());
      }
    } else {
      return bad("'stdin' must be a string or an array of strings");
    }
  }
  if (auto h = body.find("store_history"); h != body.end() && !h->is_null()) {
    if (!h->is_boolean()) {
      return bad("'store_history' must be a boolean");
    }
    r.store_history = h->get<bool>();
  }
  return r;
}

Result<OneShotRequest> OneShotRequest::from_json(const json& body, double max_timeout,
                                                 std::size_t max_file_bytes) {
  CELLGATE_ASSIGN_OR_RETURN(auto cell, ExecuteRequest::from_json(body, max_timeout));
  OneShotRequest r;
  r.cell = std::move(cell);
  if (auto k = body.find("kernel"); k != body.end() && !k->is_null()) {
    if (!k->is_string()) {
      return bad("'kernel' must be a kernelspec name");
    }
    r.kernel_name = k->get<std::string>();
  }
  auto f = body.find("files");
  if (f == body.end() || f->is_null()) {
    return r;
  }
  if (!f->is_object()) {
    return bad("'files' must be an object from work-dir path to content");
  }
  std::size_t total = 0;
  for (const auto& [path, value] : f->items()) {
    CELLGATE_ASSIGN_OR_RETURN(std::string rel, store::files::normalize(path));
    std::string bytes;
    if (value.is_string()) {
      bytes = value.get<std::string>();
    } else if (value.is_object() && value.value("encoding", json()) == "base64" &&
               value.contains("content") && value["content"].is_string()) {
      auto decoded = base64_decode(value["content"].get_ref<const std::string&>(),
                                   Base64Spaces::kAnyWhitespace);
      if (!decoded) {
        return bad("files['" + path + "']: the content is not valid base64");
      }
      bytes = std::move(decoded).value();
    } else {
      return bad("files['" + path +
                 "'] must be a string, or {\"content\": ..., \"encoding\": "
                 "\"base64\"}");
    }
    total += bytes.size();
    if (total > max_file_bytes) {
      return make_error(
          ErrorCode::kResourceExhausted, "too_large",
          "the files are over the limit of " + std::to_string(max_file_bytes) + " bytes in all");
    }
    r.files[rel] = std::move(bytes);
  }
  return r;
}

}  // namespace cellgate::execute
