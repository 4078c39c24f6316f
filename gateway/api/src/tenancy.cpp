// A tenant's key on the Jupyter and agent routes (api.hpp, "Tenants"): which routes it may use,
// its kernels only (another's id is 404, as an unknown one), lists filtered, what it starts
// recorded as its own (tenants/owners.hpp). Everything else is the operator's: 403.
#include <algorithm>

#include "cellgate/api/api.hpp"

namespace cellgate::api {
namespace {

using http::Call;
using http::Request;
using http::Response;
using http::Status;
using http::Verb;
using nlohmann::json;

// Answers through `inner` after `edit` had the JSON body of a successful answer (not streamed).
class EditingExchange : public http::Exchange {
 public:
  EditingExchange(std::shared_ptr<http::Exchange> inner, std::function<void(Response&)> edit)
      : inner_(std::move(inner)), edit_(std::move(edit)) {}
  void reply(Response res) override {
    if (res.result_int() >= 200 && res.result_int() < 300) {
      edit_(res);
    }
    inner_->reply(std::move(res));
  }
  void begin(Response head) override { inner_->begin(std::move(head)); }
  bool write(std::string data) override { return inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  void watch(std::function<void()> on_gone) override { inner_->watch(std::move(on_gone)); }
  std::string peer() const override { return inner_->peer(); }

 private:
  std::shared_ptr<http::Exchange> inner_;
  std::function<void(Response&)> edit_;
};

// Charges a tenant's one-shot cell to its CPU budget: the answer's metrics.cpu_ms, in a JSON
// answer or the streamed answer's line that carries it.
class ChargingExchange : public http::Exchange {
 public:
  ChargingExchange(std::shared_ptr<http::Exchange> inner, std::function<void(std::uint64_t)> charge)
      : inner_(std::move(inner)), charge_(std::move(charge)) {}
  void reply(Response res) override {
    look_at(res.body());
    inner_->reply(std::move(res));
  }
  void begin(Response head) override { inner_->begin(std::move(head)); }
  bool write(std::string data) override {
    std::string_view rest = data;
    for (auto eol = rest.find('\n'); !charged_ && eol != std::string_view::npos;
         eol = rest.find('\n')) {
      append(rest.substr(0, eol));
      look_at(line_);
      line_.clear();
      rest.remove_prefix(eol + 1);
    }
    if (!charged_) {
      append(rest);
    }
    return inner_->write(std::move(data));
  }
  void end() override {
    look_at(line_);
    inner_->end();
  }
  void watch(std::function<void()> on_gone) override { inner_->watch(std::move(on_gone)); }
  std::string peer() const override { return inner_->peer(); }

 private:
  static constexpr std::size_t kMaxLine = 4u << 20;  // a longer line is not the one with metrics
  void append(std::string_view part) {
    line_.append(part.substr(0, kMaxLine - std::min(kMaxLine, line_.size())));
  }
  void look_at(std::string_view text) {
    if (charged_ || text.find("\"cpu_ms\"") == std::string_view::npos) {
      return;
    }
    if (text.substr(0, 5) == "data:") {
      text.remove_prefix(5);  // server-sent events
    }
    const json j = json::parse(text, nullptr, false);
    for (const json* at : {&j, j.is_object() && j.contains("result") ? &j["result"] : nullptr}) {
      if (at == nullptr || !at->is_object() || !at->contains("metrics")) {
        continue;
      }
      const json& m = (*at)["metrics"];
      if (m.is_object() && m.contains("cpu_ms") && m["cpu_ms"].is_number_unsigned()) {
        charged_ = true;
        charge_(m["cpu_ms"].get<std::uint64_t>() * 1000);
        return;
      }
    }
  }
  std::shared_ptr<http::Exchange> inner_;
  std::function<void(std::uint64_t)> charge_;
  std::string line_;
  bool charged_ = false;
};

// The kernel id of a kernel model ("id") or a session model ("kernel": {"id"}).
std::string kernel_of(const json& item, bool session) {
  const json* k =
      session ? (item.contains("kernel") && item["kernel"].is_object() ? &item["kernel"] : nullptr)
              : &item;
  if (k == nullptr || !k->contains("id") || !(*k)["id"].is_string()) {
    return "";
  }
  return (*k)["id"].get<std::string>();
}

}  // namespace

Result<void> Api::tenant_room(const std::string& tenant, bool kernel) const {
  if (options_.cpu_budget != nullptr) {
    if (auto why = options_.cpu_budget->refusal(tenant, std::chrono::system_clock::now())) {
      return make_error(ErrorCode::kResourceExhausted, "tenant_cpu_budget", *why);
    }
  }
  if (!kernel) {
    return ok_result();
  }
  if (options_.disk_limit != nullptr) {
    CELLGATE_TRY(options_.disk_limit->room(tenant, options_.work_dir_bytes));
  }
  if (options_.tenant_max_kernels != 0 && options_.owners != nullptr &&
      options_.owners->count(tenant, [this](const std::string& k) {
        return bool(registry_.find(k));
      }) >= options_.tenant_max_kernels) {
    return make_error(ErrorCode::kResourceExhausted, "tenant_limit",
                      "this tenant has " + std::to_string(options_.tenant_max_kernels) +
                          " kernels, its most (--tenant-max-kernels); shut one down");
  }
  return ok_result();
}

void Api::record_owner(const std::string& tenant, const std::string& kernel_id) {
  if (options_.owners != nullptr) {
    options_.owners->set(kernel_id, tenant,
                         [this](const std::string& k) { return bool(registry_.find(k)); });
  }
}

bool Api::tenant_owns(const std::string& tenant, const std::string& kernel_id) const {
  return options_.owners != nullptr && options_.owners->owned_by(kernel_id, tenant);
}

std::optional<Response> Api::tenant_gate(Call& call, const std::string& tenant) {
  const auto parts = http::split_path(call.target.path);
  const Verb method = call.req.method();
  auto refuse = [&] {
    return http::error_response(
        call.req, make_error(ErrorCode::kPermissionDenied, "tenant_key",
                             "this route is the operator's; a tenant's API key reaches its own "
                             "kernels (/api/kernels, /api/sessions, their execute, files and "
                             "channels) and E2B's control plane"));
  };
  auto hide = [&](const std::string& id) {
    return http::error_response(call.req, make_error(ErrorCode::kNotFound, "no_such_kernel",
                                                     "Kernel does not exist: " + id));
  };
  if (parts.empty() || options_.owners == nullptr) {
    return refuse();
  }
  if (parts[0] == "kernelspecs") {
    return std::nullopt;
  }
  if (parts[0] != "api") {
    return refuse();  // /metrics, /mcp: the operator's (MCP's sessions are not scoped yet)
  }
  if (parts.size() == 1 || parts[1] == "kernelspecs" || parts[1] == "spec.yaml") {
    return std::nullopt;
  }
  // Keeps only the tenant's items of a list answer; records what a start made as its own.
  auto filter = [&](bool session) {
    call.exchange = std::make_shared<EditingExchange>(
        std::move(call.exchange), [this, tenant, session](Response& res) {
          json list = json::parse(res.body(), nullptr, false);
          json kept = json::array();  // fail closed: an answer it cannot read lists nothing
          if (!list.is_array()) {
            list = json::array();
          }
          for (auto& item : list) {
            if (tenant_owns(tenant, kernel_of(item, session))) {
              kept.push_back(std::move(item));
            }
          }
          res.body() = kept.dump(-1, ' ', false, json::error_handler_t::replace);
          res.prepare_payload();
        });
  };
  auto record = [&](bool session) {
    call.exchange = std::make_shared<EditingExchange>(
        std::move(call.exchange), [this, tenant, session](Response& res) {
          json made = json::parse(res.body(), nullptr, false);
          const std::string id = made.is_object() ? kernel_of(made, session) : "";
          if (id.empty()) {
            return;
          }
          auto owner = options_.owners->owner(id);
          if (owner && *owner != tenant) {
            return;  // never reached: the gate refused another's kernel
          }
          record_owner(tenant, id);
        });
  };
  // A start past the tenant's limits (tenant_room): a kernel's, or only the CPU budget.
  auto over_limit = [&](bool kernel = true) -> std::optional<Response> {
    if (auto room = tenant_room(tenant, kernel); !room) {
      return http::error_response(call.req, room.error());
    }
    return std::nullopt;
  };
  const std::string& what = parts[1];
  if (what == "kernels") {
    if (parts.size() == 2) {
      if (method == Verb::get) {
        filter(false);
        return std::nullopt;
      }
      auto body = http::body_object(call.req);
      if (body && body->contains("snapshot")) {
        return refuse();  // snapshots are the operator's here (E2B's control plane has its own)
      }
      if (auto full = over_limit()) {
        return full;
      }
      record(false);
      return std::nullopt;
    }
    if (!tenant_owns(tenant, parts[2])) {
      return hide(parts[2]);
    }
    if (parts.size() >= 4 &&
        (parts[3] == "move" || parts[3] == "snapshots" || parts[3] == "fork")) {
      return refuse();
    }
    return std::nullopt;
  }
  if (what == "sessions") {
    auto body = http::body_object(call.req);
    std::string asked;  // a kernel the body names
    std::string path;
    if (body && body->contains("kernel") && (*body)["kernel"].is_object()) {
      asked = kernel_of(*body, true);
    }
    if (body && body->contains("path") && (*body)["path"].is_string()) {
      path = (*body)["path"].get<std::string>();
    }
    if (!asked.empty() && !tenant_owns(tenant, asked)) {
      return hide(asked);
    }
    if (parts.size() == 2) {
      if (method == Verb::get) {
        filter(true);
        return std::nullopt;
      }
      // A POST with the path of an existing session answers that session: never another's.
      MutexLock lock(sessions_mu_);
      for (const auto& [id, s] : sessions_) {
        if (!path.empty() && s.path == path && !tenant_owns(tenant, s.kernel_id)) {
          return http::error_response(call.req,
                                      make_error(ErrorCode::kFailedPrecondition, "path_in_use",
                                                 "another session uses path " + path));
        }
      }
      if (asked.empty()) {
        if (auto full = over_limit()) {
          return full;
        }
      }
      record(true);
      return std::nullopt;
    }
    MutexLock lock(sessions_mu_);
    auto it = sessions_.find(parts[2]);
    if (it != sessions_.end() && !tenant_owns(tenant, it->second.kernel_id)) {
      return http::error_response(call.req, make_error(ErrorCode::kNotFound, "no_such_session",
                                                       "Session not found: " + parts[2]));
    }
    return std::nullopt;
  }
  if (what == "execute" || what == "artifacts") {
    // A one-shot cell in a kernel of its own; artifacts by SHA-256 (a capability: the URL an
    // answer gave).
    if (what == "execute" && method == Verb::post && options_.cpu_budget != nullptr) {
      if (auto refused = over_limit(/*kernel=*/false)) {
        return refused;
      }
      call.exchange = std::make_shared<ChargingExchange>(
          std::move(call.exchange), [budget = options_.cpu_budget, tenant](std::uint64_t usec) {
            budget->charge(tenant, usec, std::chrono::system_clock::now());
          });
    }
    return std::nullopt;
  }
  return refuse();
}

}  // namespace cellgate::api
