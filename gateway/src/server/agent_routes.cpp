// The agent routes of the Api: running cells (one JSON answer, or NDJSON / SSE events as they
// happen), one-shot runs, artifacts and the files of a kernel's work dir.
#include <boost/asio/post.hpp>
#include <fstream>
#include <iterator>

#include "api_internal.hpp"
#include "cellgate/server/api.hpp"
#include "cellgate/server/artifacts.hpp"
#include "cellgate/server/execute.hpp"
#include "cellgate/server/files.hpp"
#include "cellgate/protocol/message.hpp"
#include "streaming.hpp"

namespace cellgate::server {
namespace {

using nlohmann::json;
using detail::bad_request;
using detail::body_object;
using detail::method_not_allowed;

std::string join_from(const std::vector<std::string>& parts, std::size_t first) {
  std::string out;
  for (std::size_t i = first; i < parts.size(); ++i) {
    if (!out.empty()) {
      out += '/';
    }
    out += parts[i];
  }
  return out;
}

json file_json(const files::FileInfo& f) {
  return json{{"name", f.name},
              {"path", f.path},
              {"type", files::to_string(f.type)},
              {"size", f.size},
              {"mtime", protocol::iso8601(std::chrono::system_clock::time_point(
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::nanoseconds(f.mtime_ns))))}};
}

std::string file_content_type(const std::string& path) {
  auto dot = path.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : path.substr(dot + 1);
  static const std::map<std::string, std::string> types = {
      {"png", "image/png"},   {"jpg", "image/jpeg"},       {"jpeg", "image/jpeg"},
      {"gif", "image/gif"},   {"svg", "image/svg+xml"},    {"pdf", "application/pdf"},
      {"csv", "text/csv"},    {"txt", "text/plain"},       {"json", "application/json"},
      {"html", "text/html"},  {"py", "text/x-python"},     {"md", "text/markdown"},
  };
  auto it = types.find(ext);
  return it == types.end() ? "application/octet-stream" : it->second;
}

Response bytes_response(const Request& req, std::string body, const std::string& content_type) {
  Response res{http::status::ok, req.version()};
  res.set(http::field::server, "cellgate");
  res.set(http::field::content_type, content_type);
  // Kernel-made content (an SVG with script, an HTML file) must not run as the gateway's origin.
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Content-Security-Policy", "sandbox; default-src 'none'");
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

}  // namespace

void Api::execute(Request req, const std::string& id, Reply reply,
                  std::shared_ptr<Exchange> exchange) {
  auto body = body_object(req);
  if (!body) {
    reply(error_response(req, body.error()));
    return;
  }
  auto request = ExecuteRequest::from_json(*body, options_.execute_max_timeout);
  if (!request) {
    reply(error_response(req, request.error()));
    return;
  }
  if (auto k = manager_.find(id); !k) {
    reply(error_response(req, k.error()));
    return;
  }
  detail::run_streamed(pool_, req, std::move(reply), std::move(exchange), *this,
                       keepalive_interval(),
                       [this, id, request = std::move(request).value()](const RunOptions& run) {
                         return executor_->run(id, request, run);
                       });
}

void Api::execute_once(Request req, Reply reply, std::shared_ptr<Exchange> exchange) {
  if (req.method() != http::verb::post) {
    reply(method_not_allowed(req));
    return;
  }
  auto body = body_object(req);
  if (!body) {
    reply(error_response(req, body.error()));
    return;
  }
  auto request = OneShotRequest::from_json(*body, options_.execute_max_timeout,
                                           options_.max_file_bytes);
  if (!request) {
    reply(error_response(req, request.error()));
    return;
  }
  detail::run_streamed(pool_, req, std::move(reply), std::move(exchange), *this,
                       keepalive_interval(),
                       [this, request = std::move(request).value()](const RunOptions& run) {
                         return executor_->run_once(request, run);
                       });
}

std::chrono::milliseconds Api::keepalive_interval() const {
  return std::chrono::milliseconds(
      static_cast<long long>(std::max(0.05, options_.execute_keepalive) * 1000));
}

void Api::kernel_artifacts(const Request& req, const std::string& id, Reply reply) {
  auto records = executor_->artifacts().list(id);
  if (records.empty() && !manager_.find(id)) {
    reply(error_response(req, make_error(ErrorCode::kNotFound, "no_such_kernel",
                                         "no kernel " + id + " and no artifacts of one")));
    return;
  }
  json list = json::array();
  for (const auto& r : records) {
    list.push_back(r.to_json());
  }
  reply(json_response(req, http::status::ok, json{{"kernel_id", id}, {"artifacts", list}}));
}

void Api::artifact(const Request& req, const std::vector<std::string>& parts, Reply reply) {
  if (parts.size() != 3) {
    reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such route")));
    return;
  }
  if (req.method() != http::verb::get) {
    reply(method_not_allowed(req));
    return;
  }
  auto found = executor_->artifacts().locate(parts[2]);
  if (!found) {
    reply(error_response(req, found.error()));
    return;
  }
  std::ifstream in(found->first, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    reply(error_response(req, make_error(ErrorCode::kInternal, "artifact_io",
                                         "cannot read artifact " + parts[2])));
    return;
  }
  reply(bytes_response(req, std::move(bytes), found->second));
}

void Api::files(Request req, const std::vector<std::string>& parts, Reply reply) {
  const std::string& id = parts[2];
  auto kernel = manager_.find(id);
  if (!kernel) {
    reply(error_response(req, kernel.error()));
    return;
  }
  const std::string raw = join_from(parts, 4);
  const auto method = req.method();
  if (method != http::verb::get && method != http::verb::put && method != http::verb::delete_) {
    reply(method_not_allowed(req));
    return;
  }
  std::string rel;
  if (!raw.empty()) {
    auto normalized = files::normalize(raw);
    if (!normalized) {
      reply(error_response(req, normalized.error()));
      return;
    }
    rel = std::move(normalized).value();
  } else if (method != http::verb::get) {
    reply(error_response(req, bad_request("name a file: /api/kernels/{id}/files/{path}")));
    return;
  }
  offload(
      [this, req = std::move(req), k = std::move(kernel).value(), rel]() -> Response {
        auto dir = files::WorkDir::open(k->work_dir(), k->uid(), k->uid());
        if (!dir) {
          return error_response(req, dir.error());
        }
        switch (req.method()) {
          case http::verb::put: {
            auto info = dir->write(rel, req.body(), options_.max_file_bytes,
                                   /*make_parents=*/true);
            return info ? json_response(req, http::status::created, file_json(*info))
                        : error_response(req, info.error());
          }
          case http::verb::delete_: {
            auto removed = dir->remove(rel);
            return removed ? json_response(req, http::status::no_content, json())
                           : error_response(req, removed.error());
          }
          default: {
            // A directory lists; a file is its bytes.
            auto listing = dir->list(rel);
            if (listing) {
              json entries = json::array();
              for (const auto& e : listing->entries) {
                entries.push_back(file_json(e));
              }
              return json_response(req, http::status::ok,
                                   json{{"path", rel},
                                        {"entries", entries},
                                        {"truncated", listing->truncated}});
            }
            if (listing.error().reason != "not_a_directory") {
              return error_response(req, listing.error());
            }
            auto bytes = dir->read(rel, options_.max_file_bytes);
            return bytes ? bytes_response(req, std::move(bytes).value(), file_content_type(rel))
                         : error_response(req, bytes.error());
          }
        }
      },
      std::move(reply));
}

}  // namespace cellgate::server
