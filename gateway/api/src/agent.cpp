// The agent routes of the Api: running cells (one JSON answer, or NDJSON / SSE events as they
// happen), one-shot runs, artifacts and the files of a kernel's work dir.
#include <fstream>
#include <iterator>

#include "cellgate/api/api.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/files.hpp"
#include "executions.hpp"
#include "streaming.hpp"

namespace cellgate::api {
namespace {

using http::bad_request;
using http::body_object;
using http::Call;
using http::error_response;
using http::json_response;
using http::Response;
using http::Status;
using http::Verb;
using nlohmann::json;

std::string file_content_type(const std::string& path) {
  auto dot = path.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : path.substr(dot + 1);
  static const std::map<std::string, std::string> types = {
      {"png", "image/png"},  {"jpg", "image/jpeg"},    {"jpeg", "image/jpeg"},
      {"gif", "image/gif"},  {"svg", "image/svg+xml"}, {"pdf", "application/pdf"},
      {"csv", "text/csv"},   {"txt", "text/plain"},    {"json", "application/json"},
      {"html", "text/html"}, {"py", "text/x-python"},  {"md", "text/markdown"},
  };
  auto it = types.find(ext);
  return it == types.end() ? "application/octet-stream" : it->second;
}

}  // namespace

// {"detach": true}: 202 with the execution's id at once; the cell runs on whoever leaves, its
// events kept for GET .../executions/{eid} (executions.hpp). It is cancelled only as any cell
// is: by its timeout, or the kernel's end.
void Api::start_detached(http::Call& c, const std::string& kernel_id,
                         execute::ExecuteRequest request) {
  const std::string eid = executions_->begin(kernel_id);
  execute::RunOptions run;
  run.client = detail::describe_client(c.req, *c.exchange);
  std::shared_ptr<Executions> log = executions_;
  run.on_event = [log, eid](const json& event) { log->event(eid, event); };
  (void)executor_.run(kernel_id, std::move(request), std::move(run),
                      [log, eid](execute::Answer answer) { log->end(eid, answer); });
  c.reply(json_response(c.req, Status::accepted,
                        json{{"execution_id", eid},
                             {"kernel_id", kernel_id},
                             {"url", base_ + "/api/kernels/" + kernel_id + "/executions/" + eid}}));
}

std::chrono::milliseconds Api::keepalive_interval() const {
  return std::chrono::milliseconds(
      static_cast<long long>(std::max(0.05, options_.execute_keepalive) * 1000));
}

void Api::add_agent_routes() {
  router_.add(Verb::post, "/api/kernels/{id}/execute", [this](Call& c) {
    auto body = body_object(c.req);
    if (!body) {
      return c.fail(body.error());
    }
    auto request = execute::ExecuteRequest::from_json(*body, options_.execute_max_timeout);
    if (!request) {
      return c.fail(request.error());
    }
    const std::string id = c.param("id");
    if (auto k = registry_.find(id); !k) {
      return c.fail(k.error());
    }
    if (auto d = body->find("detach"); d != body->end() && !d->is_null()) {
      if (!d->is_boolean()) {
        return c.fail(bad_request("'detach' must be a boolean"));
      }
      if (d->get<bool>()) {
        return start_detached(c, id, std::move(request).value());
      }
    }
    // A hibernated kernel is resumed by its cell (execute/src/cell.cpp).
    detail::answer_cell(c.req, c.exchange, detail::encoder_for(c.req), keepalive_interval(),
                        [this, id, request = std::move(request).value()](
                            execute::RunOptions run, execute::Done done) mutable {
                          return executor_.run(id, std::move(request), std::move(run),
                                               std::move(done));
                        });
  });

  router_.add(Verb::get, "/api/kernels/{id}/executions/{eid}", [this](Call& c) {
    std::size_t after = 0;
    if (auto it = c.target.query.find("after"); it != c.target.query.end()) {
      const std::string& text = it->second;
      if (text.empty() || text.size() > 12 ||
          !std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        return c.fail(bad_request("'after' is a count of events already read (0, 1, ...)"));
      }
      after = std::stoull(text);
    }
    auto page = executions_->read(c.param("id"), c.param("eid"), after);
    if (!page) {
      return c.fail(page.error());
    }
    c.reply(json_response(c.req, Status::ok, *page));
  });

  router_.add(Verb::post, "/api/execute", [this](Call& c) {
    auto body = body_object(c.req);
    if (!body) {
      return c.fail(body.error());
    }
    auto request = execute::OneShotRequest::from_json(*body, options_.execute_max_timeout,
                                                      options_.max_file_bytes);
    if (!request) {
      return c.fail(request.error());
    }
    detail::answer_cell(c.req, c.exchange, detail::encoder_for(c.req), keepalive_interval(),
                        [this, request = std::move(request).value()](execute::RunOptions run,
                                                                     execute::Done done) mutable {
                          return executor_.run_once(std::move(request), std::move(run),
                                                    std::move(done));
                        });
  });

  router_.add(Verb::get, "/api/kernels/{id}/artifacts", [this](Call& c) {
    const std::string id = c.param("id");
    auto records = executor_.artifacts().list(id);
    if (records.empty() && !registry_.find(id)) {
      return c.fail(make_error(ErrorCode::kNotFound, "no_such_kernel",
                               "no kernel " + id + " and no artifacts of one"));
    }
    json list = json::array();
    for (const auto& r : records) {
      list.push_back(r.to_json());
    }
    c.reply(json_response(c.req, Status::ok, json{{"kernel_id", id}, {"artifacts", list}}));
  });

  // An artifact by its SHA-256. The kernel-scoped form carries a node-routable id
  // (docs/scale-out.md), so a router finds the node that stored it; it answers only for an
  // artifact that kernel made. The bare form answers on the node that has it.
  auto serve_artifact = [this](Call& c) {
    auto found = executor_.artifacts().locate(c.param("sha256"));
    if (!found) {
      return c.fail(found.error());
    }
    offload(
        [req = c.req, path = found->first, type = found->second, sha = c.param("sha256")] {
          std::ifstream in(path, std::ios::binary);
          std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          if (!in.good() && !in.eof()) {
            return error_response(req, make_error(ErrorCode::kInternal, "artifact_io",
                                                  "cannot read artifact " + sha));
          }
          return http::bytes_response(req, std::move(bytes), type);
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  };
  router_.add(Verb::get, "/api/artifacts/{sha256}", serve_artifact);
  router_.add(Verb::get, "/api/kernels/{id}/artifacts/{sha256}", [this, serve_artifact](Call& c) {
    const std::string id = c.param("id");
    const std::string sha = c.param("sha256");
    bool made = false;
    for (const auto& r : executor_.artifacts().list(id)) {
      made = made || r.sha256 == sha;
    }
    if (!made) {
      if (!registry_.find(id)) {
        return c.fail(
            protocol::unknown_id(id, make_error(ErrorCode::kNotFound, "no_such_kernel",
                                                "no kernel " + id + " and no artifacts of one")));
      }
      return c.fail(make_error(ErrorCode::kNotFound, "no_such_artifact",
                               "kernel " + id + " made no artifact " + sha));
    }
    serve_artifact(c);
  });

  auto files = [this](Call& c) {
    auto kernel = registry_.find(c.param("id"));
    if (!kernel) {
      return c.fail(kernel.error());
    }
    const std::string raw = c.param("path");
    std::string rel;
    if (!raw.empty()) {
      auto normalized = store::files::normalize(raw);
      if (!normalized) {
        return c.fail(normalized.error());
      }
      rel = std::move(normalized).value();
    } else if (c.req.method() != Verb::get) {
      return c.fail(bad_request("name a file: /api/kernels/{id}/files/{path}"));
    }
    auto reply = [ex = c.exchange](Response r) { ex->reply(std::move(r)); };
    offload(
        [this, req = std::move(c.req), k = std::move(kernel).value(), rel]() -> Response {
          auto dir = store::files::WorkDir::open(k->work_dir(), k->files_uid(), k->files_uid());
          if (!dir) {
            return error_response(req, dir.error());
          }
          switch (req.method()) {
            case Verb::put: {
              auto info = dir->write(rel, req.body(), options_.max_file_bytes,
                                     /*make_parents=*/true);
              return info ? json_response(req, Status::created, store::files::to_json(*info))
                          : error_response(req, info.error());
            }
            case Verb::delete_: {
              auto removed = dir->remove(rel);
              return removed ? json_response(req, Status::no_content, json())
                             : error_response(req, removed.error());
            }
            default: {
              // A directory lists; a file is its bytes.
              auto listing = dir->list(rel);
              if (listing) {
                json entries = json::array();
                for (const auto& e : listing->entries) {
                  entries.push_back(store::files::to_json(e));
                }
                return json_response(
                    req, Status::ok,
                    json{{"path", rel}, {"entries", entries}, {"truncated", listing->truncated}});
              }
              if (listing.error().reason != "not_a_directory") {
                return error_response(req, listing.error());
              }
              auto bytes = dir->read(rel, options_.max_file_bytes);
              return bytes ? http::bytes_response(req, std::move(bytes).value(),
                                                  file_content_type(rel))
                           : error_response(req, bytes.error());
            }
          }
        },
        std::move(reply));
  };
  router_.add({Verb::get, Verb::put, Verb::delete_}, "/api/kernels/{id}/files", files);
  router_.add({Verb::get, Verb::put, Verb::delete_}, "/api/kernels/{id}/files/{path*}", files);
}

}  // namespace cellgate::api
