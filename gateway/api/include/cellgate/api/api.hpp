// The Jupyter API and the agent API on one listener: routes from requests to the kernel registry
// and the executor — parse, call, answer.
//
//   api::Api api(registry, executor, {.base_url = "/", .token = token}, offload);
//   auto listener = http::Listener::open(ioc, ip, port, api, http_options);
//
// Jupyter routes (under base_url): /api, /api/spec.yaml (this API as OpenAPI 3, openapi.yaml),
// /api/kernelspecs[/{name}], /kernelspecs/{name}/{file},
// /api/kernels[/{id}[/interrupt|/restart]], /api/sessions[/{id}], and the WebSocket
// /api/kernels/{id}/channels (both formats; channels.hpp). Agent routes: /api/kernels/{id}/execute,
// /api/execute, /api/kernels/{id}/artifacts, /api/artifacts/{sha256}, /api/kernels/{id}/files/….
// Errors are JSON {"reason", "message", "error"} with the status from http::status_for().
// Tenants: the gateway's token sees everything; a tenant's API key (ApiOptions::keys) reaches the
// kernelspecs and its own kernels and sessions only (another's id is 404, lists are filtered,
// what it starts is recorded as its own), and nothing else (403): tenancy.cpp.
//
// Thread-safety: handle() and upgrade() may be called from any network thread. Blocking work
// (kernel starts, restarts, shutdowns, file I/O) goes to `offload`; cells never block a thread.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cellgate/execute/executor.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/http/stats.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/tenants/cpu_budget.hpp"
#include "cellgate/tenants/disk_limit.hpp"
#include "cellgate/tenants/keys.hpp"
#include "cellgate/tenants/owners.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::api {

// This gateway as one node of a cluster (docs/scale-out.md).
struct NodeOptions {
  // Peers whose lists GET /api/kernels and /api/sessions merge: "host[:port]" ("" port: this
  // gateway's own), a name resolving to every peer (a headless Service) or an address. This
  // node may be among them (answers are merged by id). Empty: lists are this node's.
  std::vector<std::string> peers;
  int own_port = 8888;
  std::chrono::milliseconds peer_deadline{1000};  // each peer's whole answer
  // The secret every node of the cluster shares for moving kernels (moves.cpp): the manifest of
  // each archive one node sends another is signed with it (HMAC-SHA256), and an archive whose
  // manifest it does not verify is never unpacked. "": this node neither sends nor takes kernels.
  std::string move_key;
};

struct ApiOptions {
  std::string base_url = "/";
  std::string token;                       // "" : every request is allowed
  std::vector<std::string> allow_origins;  // exact origins, or "*"
  double execute_max_timeout = 600;        // seconds; longer requests are clamped
  double execute_keepalive = 3;            // seconds between keepalive events when streaming
  std::size_t max_file_bytes = 16u << 20;  // the files API and one-shot files
  bool jailed = true;                      // kernelspec display names say "(cellgate, jailed)"
  // GET /api/kernels and GET /api/sessions answer 403 when false (Kernel Gateway's
  // list_kernels, whose default is false; cellgate's is true, as jupyter_server's).
  bool list_kernels = true;
  // serve --allow-debugger. Jailed, a kernelspec's metadata.debugger (what JupyterLab's debugger
  // reads) is true only for kernelspecs that set metadata.cellgate.debugger and only then.
  bool allow_debugger = false;
  std::shared_ptr<http::HttpStats> stats;  // refusals counted for /metrics; null: not counted
  NodeOptions node;
  // Detached cells' events go to <state_dir>/executions ("": kept in memory only).
  std::string state_dir;
  // Tenants (tenancy.cpp): a request whose token is a tenant's API key (`cellgate keys`) reaches
  // only that tenant's kernels, in `owners`; null: the gateway's token only.
  tenants::KeyStore* keys = nullptr;
  tenants::KernelOwners* owners = nullptr;
  // Kernels one tenant may have at once (its E2B sandboxes' included); more: 403, as
  // max_kernels. 0: no limit but max_kernels.
  std::size_t tenant_max_kernels = 0;
  // Each tenant's CPU-seconds; a tenant past its budget starts nothing (403), and its one-shot
  // cells are charged to it. Null: no budget.
  tenants::CpuBudget* cpu_budget = nullptr;
  // The disk each tenant may hold: a start needs room for its work dir (work_dir_bytes). Null:
  // no limit.
  const tenants::DiskLimit* disk_limit = nullptr;
  std::uint64_t work_dir_bytes = 0;
};

struct Session {
  std::string id, path, name, type, kernel_id;
};

class Api : public http::Handler {
 public:
  Api(kernels::KernelRegistry& registry, execute::Executor& executor, ApiOptions options,
      util::Offload offload);
  ~Api() override;

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;
  // For tests: the whole answer through a callback.
  void handle(http::Request req, http::Reply reply) {
    handle(std::move(req), std::make_shared<http::LambdaExchange>(std::move(reply)));
  }

  // Serves `path` below base_url (e.g. "/mcp") with another handler, behind the same Origin
  // check and token auth as every route — except that a wrong token is 401 there, as MCP
  // clients expect. Call before serving; `handler` outlives the Api's use of it. With `tenants`, a
  // tenant's API key reaches it too, named in the request's http::kTenantField; else 403.
  void mount(std::string path, http::Handler& handler, bool tenants = false);

  // Whether `tenant` may start something now: its CPU budget, and for a kernel (`kernel`) its disk
  // and --tenant-max-kernels (racing starts may pass them by as many as start at once).
  // kResourceExhausted naming the limit. MCP's conversations ask it too (tenancy.cpp).
  Result<void> tenant_room(const std::string& tenant, bool kernel) const;
  // Records `kernel_id` as `tenant`'s.
  void record_owner(const std::string& tenant, const std::string& kernel_id);

  // Adds CORS headers for an allowed Origin.
  void decorate(const http::Request& req, http::Response& res) const;
  // Whether the Origin header (if any) is allowed: same host, or in allow_origins.
  bool origin_allowed(const http::Request& req) const;

  // The node's tag and this run's epoch (4 hex digits each), known once the state dir is
  // claimed; before serving.
  void set_node(std::string tag, std::string epoch) {
    node_tag_ = std::move(tag);
    node_epoch_ = std::move(epoch);
  }

 private:
  // The refusal of a request without a valid token; nullopt when it may go on. A tenant's key
  // (options_.keys) is valid only where `tenant` is given, which then names the tenant.
  std::optional<http::Response> authenticate(const http::Request& req, const http::Target& target,
                                             std::string* tenant = nullptr) const;
  // tenancy.cpp: what a tenant's request may reach (a refusal, else nullopt, its exchange maybe
  // wrapped to filter a list or record what it started).
  std::optional<http::Response> tenant_gate(http::Call& call, const std::string& tenant);
  bool tenant_owns(const std::string& tenant, const std::string& kernel_id) const;

  // Removes base_url from the front of `path`; false when the path is not under it.
  bool strip_base(std::string& path) const;
  http::Upgrade decide_upgrade(const http::Request& req);
  void add_jupyter_routes();
  void add_agent_routes();
  // node.cpp: GET /api/node, POST /api/node/drain; the peer fan-out of lists.
  void add_node_routes();
  // moves.cpp: POST /api/kernels/{id}/move here, /api/node/imports… on the receiving node.
  void add_move_routes();
  // moves.cpp: the courier of registry_.move_out(): signs the manifest and uploads the archive
  // to the peer with tag `to` ("": the one with the most room); answers that peer's tag.
  Result<std::string> send_kernel(const kernels::MovedKernel& moved, const std::string& to,
                                  const std::vector<Session>& sessions);
  void start_detached(http::Call& c, const std::string& kernel_id, execute::ExecuteRequest request);
  // `local` (this node's list at `path`) merged with every peer's ?scope=local answer, by id;
  // blocking (the offload pool). The peers that did not answer in time go to `missing`.
  nlohmann::json merge_peer_lists(const std::string& path, nlohmann::json local,
                                  std::vector<std::string>& missing) const;
  bool fans_out(const http::Target& target) const;
  // Answers `local` (this node's list at `path`), merged with the peers' unless the request
  // asks ?scope=local or there are none.
  void reply_list(http::Call& c, const std::string& path, nlohmann::json local);
  // Runs blocking work on the offload pool and replies from there.
  void offload(std::function<http::Response()> work, http::Reply reply);
  std::chrono::milliseconds keepalive_interval() const;
  nlohmann::json spec_model(const kernel::KernelSpec& spec) const;
  nlohmann::json session_model(const Session& s) const;
  void sessions_post(http::Call& call);
  void sessions_patch(http::Call& call);

  kernels::KernelRegistry& registry_;
  execute::Executor& executor_;
  const ApiOptions options_;
  std::string node_tag_ = "0000", node_epoch_;  // set_node()
  util::Offload offload_;
  // Detached cells (src/executions.hpp); shared with their callbacks, which may outlive us.
  std::shared_ptr<class Executions> executions_;
  std::string base_;  // base_url without its trailing slash ("" for "/")
  http::Router router_;

  struct Mount {
    http::Handler* handler = nullptr;
    bool tenants = false;  // a tenant's key may use it
  };
  std::map<std::string, Mount> mounts_;  // path below base_url → its handler

  // Archives arriving from other nodes (moves.cpp).
  std::shared_ptr<class Imports> imports_;

  Mutex sessions_mu_;
  std::map<std::string, Session> sessions_ CELLGATE_GUARDED_BY(sessions_mu_);
};

}  // namespace cellgate::api
