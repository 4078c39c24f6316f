#include "cellgate/server/server.hpp"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include "cellgate/api/api.hpp"
#include "cellgate/api/e2b_api.hpp"
#include "cellgate/broker/broker.hpp"
#include "cellgate/client/kernels.hpp"
#include "cellgate/engine/engine.hpp"
#include "cellgate/engine/host.hpp"
#include "cellgate/envd/envd_api.hpp"
#include "cellgate/http/listener.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/kernels/uid_allocator.hpp"
#include "cellgate/mcp/http_endpoint.hpp"
#include "cellgate/mcp/server.hpp"
#include "cellgate/notebook_http/notebook.hpp"
#include "cellgate/notebook_http/service.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/sandboxes/front.hpp"
#include "cellgate/sandboxes/registry.hpp"
#include "cellgate/sandboxes/webhooks.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/text.hpp"
#include "cellgate/tenants/cpu_budget.hpp"
#include "cellgate/tenants/keys.hpp"
#include "cellgate/tenants/owners.hpp"
#include "metrics.hpp"
#include "node.hpp"
#include "privsep.hpp"
#include "systemd.hpp"
#include "tenant_budget.hpp"

namespace cellgate::server {
namespace {

namespace net = boost::asio;

// Blocking work is mostly waiting (a kernel start waits for the kernel to answer), so many
// threads: 20 starts at once should take one start's time.
constexpr int kOffloadThreads = 32;
constexpr int kCellThreads = 2;
// Buffers this large are mmap'd by malloc, so each is given back to the system when freed. glibc
// raises its threshold (128 KiB) to the size of each mmap'd block freed, up to 32 MiB, after
// which a flood's 1 MB messages come from its arenas and stay there: 8 non-reading WebSocket
// clients of a kernel printing 300 x 1 MB left the gateway at 459 MiB after they went (18 before).
constexpr int kMmapThresholdBytes = 256 << 10;
// What WebSocket clients must have held together (--max-ws-total-bytes' budget) before malloc is
// trimmed once they let go of most of it: smaller messages stay in malloc's arenas even so
// (300 x 64 KiB: 242 MiB kept after the clients left).
constexpr std::size_t kTrimAfterWsBytes = 64u << 20;

std::string default_state_dir() {
  if (const char* d = std::getenv("CELLGATE_STATE_DIR"); d != nullptr && *d != '\0') {
    return d;
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/root") + "/.local/state/cellgate";
}

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

// E2B's code runs in /home/user (its contexts' default cwd) and sometimes /root: the work dir.
std::vector<std::string> work_dir_aliases() {
  return {"/home/user", "/root"};
}

// Every part below the front ends, from `cellgate serve`'s options.
// --seed in the jupyter-websocket mode: the notebook's code cells, for every new kernel of its
// language (metadata.language_info.name, else its kernelspec's). A notebook that cannot be read
// stops serve before anything starts.
kernels::SeedOptions seed_options(const std::string& path) {
  auto notebook = notebook_http::load_notebook(path);
  if (!notebook) {
    throw std::invalid_argument("--seed: " + notebook.error().message);
  }
  kernels::SeedOptions seed;
  seed.source = path;
  seed.language = notebook->language;
  if (seed.language.empty() && !notebook->kernel_name.empty()) {
    if (auto spec = kernel::find_kernelspec(notebook->kernel_name)) {
      seed.language = spec->language;
    }
  }
  seed.cells = std::move(notebook->code_cells);
  return seed;
}

engine::EngineOptions engine_options(const ServeOptions& o) {
  engine::EngineOptions e;
  kernels::RegistryOptions& r = e.registry;
  r.state_dir = o.state_dir;
  r.max_kernels = o.max_kernels;
  r.cull_idle_timeout = o.cull_idle_timeout;
  r.hibernate_after = o.hibernate_after;
  r.hibernate_disk_max = o.hibernate_disk_max;
  r.cull_interval = o.cull_interval;
  r.cull_connected = o.cull_connected;
  r.cull_busy = o.cull_busy;
  r.env_allowlist = o.env_allowlist;
  r.kernel_env = {{"KERNEL_GATEWAY", "1"}};  // as Kernel Gateway sets it in its kernels
  r.default_kernel = o.default_kernel;
  r.force_kernel = o.force_kernel;
  r.restart_limit = o.restart_limit;
  r.kernel_start_timeout = o.kernel_start_timeout;
  r.heartbeat_timeout = o.heartbeat_timeout;
  r.max_kernel_message_bytes = o.max_kernel_message_bytes;
  r.no_jail = o.no_jail;
  r.checkpoints_unavailable = o.checkpoints_unavailable;
  r.uids.base = o.kernel_uid_base;
  r.uids.range_size = o.kernel_uid_range_size;
  r.uids.ranges = o.kernel_uid_ranges;
  r.pool_size = o.pool_size;
  r.pool_max = o.pool_max;
  r.pool_parallel = o.pool_parallel;
  r.pool_kernels = o.pool_kernels;
  r.jail = o.jail;
  r.allow_debugger = o.allow_debugger;
  // Agents get a figure's data and a DataFrame's columns beside the PNG and the HTML (notebook
  // runs do not: nbclient's outputs have no such MIME types).
  r.display_formatters = o.chart_data;
  r.work_dir_aliases = work_dir_aliases();
  if (o.api == "notebook-http") {
    // The fixed pool of seeded kernels is all: no warm pool beside it, and kernels' outputs as
    // ipykernel makes them (an execute_result's MIME bundle is a response body).
    r.pool_size = 0;
    r.pool_max = 0;
    r.display_formatters = false;
  }
  // Kernels start through the launcher; jailed python3 ipykernels fork from the zygote.
  e.zygote = o.zygote;
  e.zygote_preload = o.zygote_preload;
  e.artifacts.count = o.artifacts_per_kernel;
  e.artifacts.bytes = o.artifact_bytes_per_kernel;
  if (o.audit_log != "off") {
    e.audit.path = o.audit_log.empty() ? o.state_dir + "/audit.log" : o.audit_log;
  }
  e.audit.max_bytes = o.audit_max_bytes;
  e.audit.keep = static_cast<unsigned>(std::max(0, o.audit_keep));
  e.audit.redact.insert(e.audit.redact.end(), o.audit_redact.begin(), o.audit_redact.end());
  e.limits.stream_bytes = o.execute_stream_bytes;
  e.limits.output_bytes = o.execute_output_bytes;
  e.limits.grace = seconds_to_ms(o.execute_grace);
  e.cell_threads = kCellThreads;
  e.offload_threads = kOffloadThreads;
  return e;
}

}  // namespace

struct Server::Impl {
  ServeOptions options;
  std::string token;

  net::io_context network;
  std::unique_ptr<engine::Engine> engine;  // the parts the front ends below are built over
  std::unique_ptr<api::Api> api;
  std::unique_ptr<api::E2bApi> e2b;
  // E2B's control plane on the E2B port, over the tenants' keys (sandboxes/front.hpp).
  std::unique_ptr<tenants::KeyStore> keys;
  tenants::KernelOwners owners;  // which tenant's each kernel is (api/src/tenancy.cpp)
  std::unique_ptr<tenants::CpuBudget> cpu_budget;  // --tenant-max-cpu-seconds; null: none
  std::unique_ptr<tenants::DiskLimit> disk_limit;  // --tenant-max-disk-mb; null: none
  std::unique_ptr<sandboxes::Webhooks> webhooks;   // E2B lifecycle events; null: none
  std::unique_ptr<sandboxes::SandboxRegistry> sandboxes;
  std::unique_ptr<sandboxes::E2bFront> e2b_front;
  std::unique_ptr<envd::EnvdApi> envd;           // envd behind e2b_front: commands, PTYs, files
  std::unique_ptr<client::Kernels> mcp_kernels;  // the MCP server at /mcp, over the same parts
  std::unique_ptr<mcp::Server> mcp;
  std::unique_ptr<mcp::HttpEndpoint> mcp_endpoint;
  std::shared_ptr<http::HttpStats> http_stats = std::make_shared<http::HttpStats>();
  std::unique_ptr<MetricsEndpoint> metrics;
  // --api notebook-http: the front end served instead of the Api, over its own client seam.
  std::unique_ptr<client::Kernels> notebook_kernels;
  std::unique_ptr<notebook_http::Service> notebook;
  http::HttpOptions http_options;
  std::shared_ptr<http::TlsContext> tls;
  std::unique_ptr<http::Listener> listener;
  std::unique_ptr<http::Listener> e2b_listener;
  std::unique_ptr<AgentCheck> agent;

  util::Offload offload() { return engine->offload(); }
};

Server::Server(ServeOptions options, std::unique_ptr<kernel::KernelBackend> backend)
    : impl_(std::make_unique<Impl>()) {
  auto& o = impl_->options;
  o = std::move(options);
  if (o.token.empty() && !o.no_token) {
    o.token = kernel::random_hex(24);
  }
  if (o.state_dir.empty()) {
    o.state_dir = default_state_dir();
  }
  impl_->token = o.no_token ? "" : o.token;

  engine::EngineOptions eo = engine_options(o);
  if (o.api != "notebook-http" && !o.seed.empty()) {
    eo.registry.seed = seed_options(o.seed);
  }
  if (backend) {
    eo.registry.privilege_separated = true;
    // The broker's jails would have to be checkpointed by the broker, which cannot yet.
    eo.registry.checkpoints_unavailable =
        "the privilege-separated mode (serve --user) cannot hibernate kernels yet";
    // The range is the broker's lease (run_serve); this is the gateway's own note of it.
    eo.registry.uids.lease_dir = o.state_dir + "/uid-ranges";
  }
  auto made = engine::Engine::create(std::move(eo), std::move(backend));
  if (!made) {
    throw std::invalid_argument(made.error().message);
  }
  impl_->engine = std::move(made).value();
  auto& registry = impl_->engine->registry();
  auto& executor = impl_->engine->executor();

  api::ApiOptions ao;
  ao.stats = impl_->http_stats;
  ao.base_url = o.base_url;
  ao.token = impl_->token;
  ao.allow_origins = o.allow_origins;
  ao.execute_max_timeout = o.execute_max_timeout;
  ao.execute_keepalive = o.execute_keepalive;
  ao.max_file_bytes = o.max_file_bytes;
  ao.jailed = !o.no_jail;
  ao.allow_debugger = o.allow_debugger;
  ao.list_kernels = o.list_kernels;
  ao.node.peers = o.peers;
  if (!o.move_key_file.empty()) {
    // Fail closed: a node asked to take moved kernels never does so without its key.
    auto key = sys::read_file(o.move_key_file, 4096, "--move-key-file");
    if (!key) {
      throw std::invalid_argument(key.error().message);
    }
    std::string secret(sys::trim(*key));
    if (secret.size() < 16) {
      throw std::invalid_argument("--move-key-file " + o.move_key_file +
                                  ": the key is shorter than 16 characters");
    }
    ao.node.move_key = std::move(secret);
  }
  ao.state_dir = o.state_dir;
  ao.node.own_port = o.port;
  impl_->keys = std::make_unique<tenants::KeyStore>(tenants::keys_path(o.state_dir));
  ao.keys = impl_->keys.get();
  ao.owners = &impl_->owners;
  ao.tenant_max_kernels = o.tenant_max_kernels;
  impl_->cpu_budget = make_cpu_budget(o, registry, impl_->owners);
  impl_->disk_limit = make_disk_limit(o, registry, impl_->owners, impl_->sandboxes);
  ao.cpu_budget = impl_->cpu_budget.get();
  ao.disk_limit = impl_->disk_limit.get();
  ao.work_dir_bytes = o.jail.work_bytes;
  impl_->api = std::make_unique<api::Api>(registry, executor, std::move(ao), impl_->offload());
  api::E2bOptions e2b_options;
  e2b_options.token = impl_->token;
  e2b_options.allow_missing_token = o.e2b_no_token;
  e2b_options.execute_max_timeout = o.execute_max_timeout;
  e2b_options.execute_keepalive = o.execute_keepalive;
  e2b_options.stats = impl_->http_stats;
  impl_->e2b = std::make_unique<api::E2bApi>(registry, executor, e2b_options, impl_->offload());
  if (!o.e2b_webhooks.empty()) {
    // Fail closed: webhooks are always signed.
    std::string secret;
    if (o.e2b_webhook_secret_file.empty()) {
      throw std::invalid_argument(
          "--e2b-webhook needs --e2b-webhook-secret-file (they are signed)");
    }
    auto key = sys::read_file(o.e2b_webhook_secret_file, 4096, "--e2b-webhook-secret-file");
    if (!key) {
      throw std::invalid_argument(key.error().message);
    }
    sandboxes::WebhookOptions wo;
    wo.urls = o.e2b_webhooks;
    wo.secret = std::string(sys::trim(*key));
    auto hooks = sandboxes::Webhooks::create(std::move(wo), impl_->offload());
    if (!hooks) {
      throw std::invalid_argument(hooks.error().message);
    }
    impl_->webhooks = std::move(hooks).value();
  }
  sandboxes::SandboxOptions so;
  so.webhooks = impl_->webhooks.get();
  so.state_dir = o.state_dir;
  so.max_per_tenant = o.tenant_max_sandboxes;
  so.owners = &impl_->owners;
  so.cpu_budget = impl_->cpu_budget.get();
  so.disk_limit = impl_->disk_limit.get();
  so.shape.cpu_count = std::max(1, static_cast<int>(std::ceil(o.jail.cpus)));
  so.shape.memory_mb = static_cast<int>(o.jail.memory_bytes >> 20);
  so.shape.disk_mb = static_cast<int>(o.jail.work_bytes >> 20);
  impl_->sandboxes = std::make_unique<sandboxes::SandboxRegistry>(
      registry, executor, impl_->engine->loop(), impl_->offload(), std::move(so));
  sandboxes::FrontOptions fo;
  fo.token = impl_->token;
  fo.e2b = std::move(e2b_options);
  impl_->e2b_front =
      std::make_unique<sandboxes::E2bFront>(*impl_->sandboxes, impl_->keys.get(), *impl_->e2b,
                                            registry, executor, std::move(fo), impl_->offload());
  // envd behind the front: a sandbox of the control plane, or — for the operator, whose token is
  // then the access token — any running kernel by its id (commands in a Jupyter kernel's jail).
  auto kernel_target = [&registry, token = impl_->token](
                           std::string_view id) -> std::optional<sandboxes::SandboxTarget> {
    auto kernel = registry.find(std::string(id));
    if (id.empty() || !kernel) {
      return std::nullopt;
    }
    const auto state = (*kernel)->state();
    sandboxes::SandboxTarget t;
    t.sandbox_id = t.kernel_id = std::string(id);
    t.access_token = token;
    t.running = state == kernels::KernelState::kIdle || state == kernels::KernelState::kBusy;
    return t;
  };
  impl_->e2b_front->set_fallback(kernel_target);
  auto as_envd = [](const sandboxes::SandboxTarget& found) {
    envd::SandboxTarget t;
    t.sandbox_id = found.sandbox_id;
    t.kernel_id = found.kernel_id;
    t.access_token = found.access_token;
    t.tenant = found.tenant;
    t.running = found.running;
    return t;
  };
  envd::EnvdOptions envd_options;
  envd_options.find = [this, kernel_target,
                       as_envd](std::string_view id) -> std::optional<envd::SandboxTarget> {
    auto found = impl_->sandboxes->find(id);
    if (!found) {
      found = kernel_target(id);
    }
    if (!found) {
      return std::nullopt;
    }
    return as_envd(*found);
  };
  // A signed /files URL without E2b-Sandbox-Id: the control plane's sandboxes (not bare kernels,
  // whose token is the operator's).
  envd_options.all = [this, as_envd] {
    std::vector<envd::SandboxTarget> out;
    for (const auto& found : impl_->sandboxes->list()) {
      out.push_back(as_envd(found));
    }
    return out;
  };
  envd_options.max_upload_bytes = o.max_body_bytes;
  envd_options.jail_of = [&registry](const std::string& id) -> Result<kernel::JailTarget> {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, registry.find(id));
    return kernel->jail_target();
  };
  envd_options.offload = impl_->offload();
  impl_->envd = std::make_unique<envd::EnvdApi>(std::move(envd_options));
  impl_->e2b_front->set_envd(impl_->envd.get());

  client::Options mo;
  mo.client = "mcp";
  mo.max_timeout = o.execute_max_timeout;
  mo.max_file_bytes = o.max_file_bytes;
  mo.keepalive = seconds_to_ms(std::max(0.05, o.execute_keepalive));
  std::string base = o.base_url;
  while (!base.empty() && base.back() == '/') {
    base.pop_back();
  }
  mo.artifact_base = base + "/api/artifacts/";
  impl_->mcp_kernels = client::make_local(registry, executor, mo);
  impl_->mcp = std::make_unique<mcp::Server>(*impl_->mcp_kernels, impl_->offload(),
                                             mcp_options(*impl_->api));
  mcp::HttpEndpointOptions mcp_http;
  mcp_http.allow_origins = o.allow_origins;
  impl_->mcp_endpoint =
      std::make_unique<mcp::HttpEndpoint>(*impl_->mcp, impl_->offload(), std::move(mcp_http));
  impl_->api->mount("/mcp", *impl_->mcp_endpoint, /*tenants=*/true);

  MetricsSources sources;
  sources.registry = &registry;
  sources.executor = &executor;
  sources.http = impl_->http_stats;
  sources.open_connections = [impl = impl_.get()] {
    return (impl->listener ? impl->listener->open_connections() : 0) +
           (impl->e2b_listener ? impl->e2b_listener->open_connections() : 0);
  };
  sources.zygote_restarts = [impl = impl_.get()] {
    // A broker's zygote is the broker's: not counted here.
    auto* own = dynamic_cast<kernel::ProcessBackend*>(&impl->engine->backend());
    auto* zygote = own != nullptr ? own->zygote() : nullptr;
    return zygote != nullptr ? zygote->restarts() : -1;
  };
  impl_->metrics = std::make_unique<MetricsEndpoint>(std::move(sources));
  impl_->api->mount("/metrics", *impl_->metrics);
  impl_->http_options.stats = impl_->http_stats;

  impl_->http_options.max_body_bytes = o.max_body_bytes;
  impl_->http_options.max_header_bytes = o.max_header_bytes;
  impl_->http_options.max_control_body_bytes = o.max_control_body_bytes;
  impl_->http_options.max_connections = o.max_connections;
  impl_->http_options.max_ws_message_bytes = o.max_ws_message_bytes;
  impl_->http_options.max_ws_queue_bytes = o.max_ws_queue_bytes;
  const std::size_t trim_after = o.max_ws_total_bytes > 0
                                     ? std::min(kTrimAfterWsBytes, o.max_ws_total_bytes / 2)
                                     : kTrimAfterWsBytes;
  impl_->http_options.ws_budget =
      std::make_shared<http::ByteBudget>(o.max_ws_total_bytes, trim_after, [impl = impl_.get()] {
        // On the offload pool: a trim walks every arena, and no network thread waits for it.
        if (impl->engine->started()) {
          impl->engine->offload()([] { ::malloc_trim(0); });
        }
      });
  impl_->http_options.ws_ping_interval = o.ws_ping_interval;

  if (o.api == "notebook-http") {
    make_notebook_http(registry, executor);
  }
}

void Server::make_notebook_http(kernels::KernelRegistry& registry, execute::Executor& executor) {
  const auto& o = impl_->options;
  if (o.seed.empty()) {
    throw std::invalid_argument(
        "--api notebook-http needs --seed NOTEBOOK (the annotated notebook)");
  }
  if (o.seed.starts_with("http://") || o.seed.starts_with("https://")) {
    throw std::invalid_argument("--seed " + o.seed +
                                ": notebooks are read from files only; download it first");
  }
  auto notebook = notebook_http::load_notebook(o.seed);
  if (!notebook) {
    throw std::invalid_argument("--seed: " + notebook.error().message);
  }
  notebook_http::Options no;
  no.base_url = o.base_url;
  no.token = impl_->token;
  no.allow_origins = o.allow_origins;
  no.prespawn = std::max(1, o.prespawn);
  no.kernel_name = o.force_kernel;
  no.allow_notebook_download = o.allow_notebook_download;
  no.static_path = o.static_path;
  no.cell_timeout = o.execute_max_timeout;
  no.max_static_bytes = o.max_file_bytes;
  if (static_cast<std::size_t>(no.prespawn) > o.max_kernels) {
    throw std::invalid_argument("cannot prespawn " + std::to_string(no.prespawn) +
                                "; more than --max-kernels " + std::to_string(o.max_kernels));
  }
  client::Options co;
  co.client = "notebook-http";
  co.max_timeout = o.execute_max_timeout;
  impl_->notebook_kernels = client::make_local(registry, executor, co);
  auto service = notebook_http::Service::create(std::move(notebook).value(), std::move(no),
                                                *impl_->notebook_kernels, impl_->offload());
  if (!service) {
    throw std::invalid_argument(service.error().message);
  }
  impl_->notebook = std::move(service).value();
}

Server::~Server() {
  stop();
  impl_->listener.reset();
  impl_->e2b_listener.reset();
  impl_->agent.reset();
  impl_->cpu_budget.reset();  // a sample under way ends before it returns
  impl_->envd.reset();        // its commands killed, their pumps done, before the engine stops
  // Kernels end, then the threads (engine.hpp's teardown); then the front ends, then the engine.
  impl_->engine->stop();
  impl_->notebook.reset();
  impl_->notebook_kernels.reset();
  impl_->e2b_front.reset();
  impl_->sandboxes.reset();
  impl_->webhooks.reset();
  impl_->e2b.reset();
  impl_->mcp_endpoint.reset();
  impl_->mcp.reset();
  impl_->mcp_kernels.reset();
  impl_->api.reset();
  impl_->engine.reset();
}

const std::string& Server::token() const {
  return impl_->token;
}
kernels::KernelRegistry& Server::registry() {
  return impl_->engine->registry();
}
const ServeOptions& Server::options() const {
  return impl_->options;
}
sandboxes::SandboxRegistry& Server::sandboxes() {
  return *impl_->sandboxes;
}
int Server::e2b_port() const {
  return impl_->e2b_listener ? impl_->e2b_listener->port() : 0;
}
net::io_context& Server::network() {
  return impl_->network;
}

Result<int> Server::start() {
  auto& o = impl_->options;
  if (!o.certfile.empty() || !o.keyfile.empty() || !o.client_ca.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(impl_->tls,
                              http::TlsContext::load(o.certfile, o.keyfile, o.client_ca));
  }
  if (!o.default_kernel.empty()) {
    if (auto spec = impl_->engine->registry().kernelspec(o.default_kernel); !spec) {
      return make_error(ErrorCode::kInvalidArgument, "default_kernel",
                        "--default-kernel " + o.default_kernel + ": " + spec.error().message);
    }
  }
  if (!o.force_kernel.empty()) {
    if (auto spec = impl_->engine->registry().kernelspec(o.force_kernel); !spec) {
      return make_error(ErrorCode::kInvalidArgument, "force_kernel",
                        "--force-kernel " + o.force_kernel + ": " + spec.error().message);
    }
  }
  if (o.e2b_port != 0 && o.e2b_no_token && !http::is_loopback(o.ip)) {
    return make_error(ErrorCode::kInvalidArgument, "e2b_no_token",
                      "--e2b-no-token serves code execution without a token, so it is only "
                      "allowed on a loopback --ip (127.0.0.1 or ::1), not " +
                          o.ip);
  }
  // Before anything listens: a second gateway on one state dir would adopt the first's kernels.
  CELLGATE_TRY(impl_->engine->registry().claim_state_dir());
  // Before any id is minted (the pool's kernels, adoption's successors).
  CELLGATE_ASSIGN_OR_RETURN(
      NodeIdentity node, take_node_identity(o.state_dir, static_cast<std::uint16_t>(o.node_tag)));
  protocol::set_node(node.tag, node.epoch);
  const std::string tag = fmt::format("{:04x}", node.tag);
  impl_->http_options.response_headers = {{"X-Cellgate-Node", tag}};
  impl_->api->set_node(tag, fmt::format("{:04x}", node.epoch));
  spdlog::info("node {} (tag {}), epoch {:04x} ({})", o.node_tag, tag, node.epoch,
               node.kept ? "kept: the previous gateway of this boot" : "new");
  http::raise_open_file_limit();  // each connection is a descriptor
  if (impl_->notebook) {
    return start_notebook_http();
  }
  // A fixed threshold also stops glibc's raising it (see kMmapThresholdBytes).
  ::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  if (o.http_socket >= 0) {
    CELLGATE_ASSIGN_OR_RETURN(impl_->listener,
                              http::Listener::adopt(impl_->network, o.http_socket, *impl_->api,
                                                    impl_->http_options, impl_->tls));
  } else {
    CELLGATE_ASSIGN_OR_RETURN(impl_->listener,
                              http::Listener::open(impl_->network, o.ip, o.port, *impl_->api,
                                                   impl_->http_options, impl_->tls));
  }
  if (o.e2b_socket >= 0) {
    CELLGATE_ASSIGN_OR_RETURN(impl_->e2b_listener,
                              http::Listener::adopt(impl_->network, o.e2b_socket, *impl_->e2b_front,
                                                    impl_->http_options, impl_->tls));
  } else if (o.e2b_port != 0) {
    CELLGATE_ASSIGN_OR_RETURN(
        impl_->e2b_listener,
        http::Listener::open(impl_->network, o.ip, o.e2b_port, *impl_->e2b_front,
                             impl_->http_options, impl_->tls));
  }
  if (o.agent_port != 0) {
    auto& registry = impl_->engine->registry();
    CELLGATE_ASSIGN_OR_RETURN(impl_->agent,
                              AgentCheck::open(impl_->network, o.ip, o.agent_port, [&registry] {
                                return agent_line(registry.draining(), registry.room_percent());
                              }));
  }
  impl_->engine->start();
  impl_->sandboxes->start();  // after the kernels' adoption: the sandboxes of adopted kernels
  if (impl_->cpu_budget) {
    impl_->cpu_budget->start(impl_->engine->loop(), impl_->offload(), kCpuBudgetInterval);
  }
  impl_->listener->start();
  if (impl_->e2b_listener) {
    impl_->e2b_listener->start();
  }
  return impl_->listener->port();
}

// notebook-http: every kernel of the pool started and seeded before anything listens, so a
// notebook that cannot serve never takes a request.
Result<int> Server::start_notebook_http() {
  auto& o = impl_->options;
  ::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  const std::string& kernel = impl_->notebook->kernel_name();
  if (!kernel.empty()) {
    if (auto spec = impl_->engine->registry().kernelspec(kernel); !spec) {
      return make_error(
          ErrorCode::kInvalidArgument, "kernelspec",
          "--seed " + o.seed + " runs in kernelspec '" + kernel + "': " + spec.error().message);
    }
  }
  impl_->engine->start();
  CELLGATE_TRY(impl_->notebook->prespawn());
  if (o.http_socket >= 0) {
    CELLGATE_ASSIGN_OR_RETURN(impl_->listener,
                              http::Listener::adopt(impl_->network, o.http_socket, *impl_->notebook,
                                                    impl_->http_options, impl_->tls));
  } else {
    CELLGATE_ASSIGN_OR_RETURN(impl_->listener,
                              http::Listener::open(impl_->network, o.ip, o.port, *impl_->notebook,
                                                   impl_->http_options, impl_->tls));
  }
  impl_->listener->start();
  return impl_->listener->port();
}

void Server::run() {
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, impl_->options.threads); ++i) {
    threads.emplace_back([this] { impl_->network.run(); });
  }
  impl_->network.run();
  for (auto& t : threads) {
    t.join();
  }
}

void Server::stop() {
  impl_->network.stop();
}

namespace {

// `serve --user`: forks the privileged broker and becomes the gateway's user. Before any thread.
// `lease` holds the kernels' uid range for both processes' lifetimes.
Result<std::unique_ptr<kernel::KernelBackend>> split_privileges(
    ServeOptions& o, std::optional<kernels::UidAllocator>& lease, pid_t& broker_pid) {
  if (::geteuid() != 0) {
    return make_error(ErrorCode::kFailedPrecondition, "user",
                      "--user splits a gateway started as root; started as an ordinary user it "
                      "already is one (rootless mode), so leave --user out");
  }
  if (o.no_jail) {
    return make_error(ErrorCode::kInvalidArgument, "user",
                      "--user and --no-jail do not combine: the broker starts jailed kernels only");
  }
  CELLGATE_ASSIGN_OR_RETURN(GatewayUser user, resolve_gateway_user(o.user));
  if (o.state_dir.empty()) {
    const char* d = std::getenv("CELLGATE_STATE_DIR");
    o.state_dir = d != nullptr && *d != '\0' ? d : "/var/lib/cellgate";
  }
  o.state_dir = std::filesystem::absolute(o.state_dir).lexically_normal().string();
  while (o.state_dir.size() > 1 && o.state_dir.back() == '/') {
    o.state_dir.pop_back();
  }
  CELLGATE_TRY(prepare_state_dir(o.state_dir, user));
  if (o.audit_log.empty()) {
    o.audit_log = o.state_dir + "/audit/audit.log";  // rotated in a directory the gateway owns
  }
  const engine::EngineOptions parts = engine_options(o);
  kernels::UidRangeOptions u = parts.registry.uids;
  u.fallback_lease_dir = o.state_dir + "/run/uid-ranges";
  lease.emplace(kernels::owned_by_state_dir(std::move(u), o.state_dir));
  CELLGATE_TRY(lease->lease(kernels::recorded_kernel_uids(o.state_dir)));
  const auto range = *lease->range();

  broker::BrokerPolicy policy;
  policy.state_dir = o.state_dir;
  policy.jail = o.jail;
  policy.allow_debugger = o.allow_debugger;
  policy.work_dir_aliases = work_dir_aliases();
  policy.first_uid = range.first;
  policy.start_timeout = std::chrono::milliseconds(std::llround(o.kernel_start_timeout * 1000));
  policy.last_uid = range.last;
  policy.access_gid = user.gid;
  policy.backend = engine::launcher_options(parts);
  CELLGATE_ASSIGN_OR_RETURN(auto channel, broker::broker_channel());
  std::cout << std::flush;
  std::cerr << std::flush;
  const pid_t pid = ::fork();
  if (pid < 0) {
    return errno_error(ErrorCode::kInternal, "broker", "fork()", errno);
  }
  if (pid == 0) {
    channel.first.reset();
    for (int passed : {o.http_socket, o.e2b_socket}) {
      if (passed >= 0) {
        ::close(passed);  // the broker serves no HTTP
      }
    }
    ::prctl(PR_SET_NAME, "cellgate-broker", 0, 0, 0);
    ::_exit(broker::serve_broker(std::move(channel.second), std::move(policy)));
  }
  broker_pid = pid;
  channel.second.reset();
  CELLGATE_TRY(become_gateway_user(user));
  o.kernel_uid_base = range.first;
  o.kernel_uid_range_size = range.last - range.first + 1;
  o.kernel_uid_ranges = 1;
  spdlog::info(
      "privilege separation: this gateway runs as {} (uid {}, gid {}) with no "
      "capabilities; kernels start in the broker, pid {} (root), as uids {}-{}",
      user.name, user.uid, user.gid, pid, range.first, range.last);
  return std::unique_ptr<kernel::KernelBackend>(
      std::make_unique<broker::BrokerBackend>(std::move(channel.first)));
}

}  // namespace

int run_serve(ServeOptions options) {
  // Sockets a .socket unit passed: taken before anything forks, so no child inherits them open.
  auto passed = systemd::take_listen_sockets();
  if (!passed) {
    std::cerr << "cellgate serve: " << passed.error().message << "\n";
    return 2;
  }
  options.http_socket = passed->http;
  options.e2b_socket = passed->e2b;
  if (options.no_jail) {
    spdlog::warn("--no-jail: kernels run UNJAILED, as this user; do not give them untrusted code");
  } else {
    if (auto valid = options.jail.validate(); !valid) {
      std::cerr << "cellgate serve: " << valid.error().message << "\n";
      return 2;
    }
    for (const auto& limit : options.jail.optional) {
      spdlog::warn(
          "--optional-limits: kernels start without the {} limit where this host cannot "
          "enforce it",
          limit);
    }
    if (options.allow_debugger) {
      spdlog::warn(
          "--allow-debugger: kernelspecs with metadata.cellgate.debugger start with a "
          "loopback-only network (TCP/UDP inside their own network namespace; jail/README.md)");
    }
  }
  // The host's steps (engine/host.hpp): before the zygote, any kernel and any thread.
  engine::HostOptions host;
  host.jailed = !options.no_jail;
  host.cgroup_parent = options.cgroup_parent;
  host.checkpoint_without_landlock = options.checkpoint_without_landlock;
  host.report = [](engine::HostStep step, const std::string& line) {
    switch (step) {
      case engine::HostStep::kProbe:
        return spdlog::info("host: {}", line);
      case engine::HostStep::kPlaceCgroups:
        return spdlog::info("cgroups: {}", line);
      case engine::HostStep::kCheckpoints:
        return spdlog::info("{}", line);
      case engine::HostStep::kEnterUserNamespace:
        return spdlog::info("{}", line);
    }
  };
  auto prepared = engine::prepare_host(host);
  if (!prepared) {
    std::cerr << "cellgate serve: " << prepared.error().message << "\n";
    return 2;
  }
  if (!options.no_jail) {
    options.jail.cgroup_parent = prepared->cgroup_parent;
  }
  options.checkpoints_unavailable =
      prepared->checkpoints.available ? "" : prepared->checkpoints.reason;
  if ((options.hibernate_after > 0 || options.hibernate_on_stop) &&
      options.checkpoints_unavailable == engine::kLandlockNotCheckpointed) {
    // Hibernation was asked for and would drop a layer of the jail: the operator decides.
    std::cerr << "cellgate serve: --hibernate-after and --hibernate-on-stop need "
                 "--checkpoint-without-landlock: "
              << engine::kLandlockNotCheckpointed << "\n";
    return 2;
  }
  std::optional<kernels::UidAllocator> broker_uids;
  pid_t broker_pid = -1;
  std::unique_ptr<kernel::KernelBackend> backend;
  if (!options.user.empty()) {
    auto split = split_privileges(options, broker_uids, broker_pid);
    if (!split) {
      std::cerr << "cellgate serve: " << split.error().message << "\n";
      return 2;  // a broker already forked ends as its channel closes
    }
    backend = std::move(split).value();
  }
  // The broker ends once the gateway has closed its channel (the server's backend).
  struct ReapBroker {
    pid_t pid;
    ~ReapBroker() {
      int status = 0;
      while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  } reap_broker{broker_pid};
  std::optional<Server> server_holder;
  try {
    server_holder.emplace(std::move(options), std::move(backend));
  } catch (const std::invalid_argument& e) {
    std::cerr << "cellgate serve: " << e.what() << "\n";
    return 2;
  }
  Server& server = *server_holder;
  auto port = server.start();
  if (!port) {
    std::cerr << "cellgate serve: " << port.error().message << "\n";
    return 2;
  }
  net::io_context signals_ctx;
  net::signal_set signals(signals_ctx, SIGINT, SIGTERM, SIGUSR2);
  std::atomic<bool> hand_over{false};
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) {
      return;
    }
    hand_over = sig == SIGUSR2 || server.options().keep_kernels;
    systemd::notify("STOPPING=1");
    spdlog::info("signal {}: {}", sig,
                 hand_over ? "stopping, leaving the kernels to the next gateway on the state dir"
                 : server.options().hibernate_on_stop
                     ? "stopping: hibernating the kernels that can, ending the others"
                     : "shutting down");
    server.stop();
  });
  std::thread signal_thread([&] { signals_ctx.run(); });
  const auto& o = server.options();
  const std::string scheme = o.certfile.empty() ? "http" : "https";
  std::cout << "cellgate serve: listening on " << scheme << "://" << o.ip << ":" << *port
            << o.base_url << "\n";
  if (o.api == "notebook-http") {
    std::cout << "cellgate serve: notebook-http: the endpoints of " << o.seed << ", Swagger at "
              << o.base_url << (o.base_url.empty() || o.base_url.back() != '/' ? "/" : "")
              << "_api/spec/swagger.json\n";
  } else {
    std::cout << "cellgate serve: MCP (Streamable HTTP) at " << scheme << "://" << o.ip << ":"
              << *port
              << (o.base_url.empty() || o.base_url.back() != '/' ? o.base_url + "/" : o.base_url)
              << "mcp\n";
    if (server.e2b_port() != 0) {
      std::cout << "cellgate serve: E2B-compatible endpoints on http://" << o.ip << ":"
                << server.e2b_port() << "\n";
    }
  }
  if (!server.token().empty() && o.api == "notebook-http") {
    std::cout << "cellgate serve: token " << server.token() << "\n";
  } else if (!server.token().empty()) {
    std::cout << "cellgate serve: token " << server.token() << "\n"
              << "  JupyterLab / jupyter server: jupyter server --gateway-url=" << scheme << "://"
              << o.ip << ":" << *port << " --GatewayClient.auth_token=" << server.token() << "\n";
  }
  std::cout << std::flush;
  // Under systemd (Type=notify): ready now that it listens; a status line and the watchdog's ping
  // from the network loop, so a stalled loop is what the watchdog notices.
  auto status = [&server] {
    auto& registry = server.registry();
    return "STATUS=" + std::to_string(registry.list().size()) + " kernels, " +
           std::to_string(registry.pool_ready_total()) + " ready in the pool";
  };
  systemd::notify("READY=1\n" + status());
  // (The timer and its callback live until run() returns: the callback re-arms itself.)
  net::steady_timer upkeep(server.network());
  const auto watchdog = systemd::watchdog_interval();
  const auto every = watchdog.count() > 0
                         ? std::min<std::chrono::microseconds>(watchdog, std::chrono::seconds(5))
                         : std::chrono::microseconds(std::chrono::seconds(5));
  std::function<void()> tick = [&] {
    upkeep.expires_after(every);
    upkeep.async_wait([&](const boost::system::error_code& ec) {
      if (ec) {
        return;
      }
      systemd::notify(watchdog.count() > 0 ? "WATCHDOG=1\n" + status() : status());
      tick();
    });
  };
  if (std::getenv("NOTIFY_SOCKET") != nullptr) {
    tick();
  }
  server.run();
  signals_ctx.stop();
  signal_thread.join();
  if (hand_over) {
    server.registry().hand_over();
  } else if (server.options().hibernate_on_stop) {
    server.registry().hibernate_and_stop();
  } else {
    server.registry().shutdown_all();
  }
  return 0;
}

}  // namespace cellgate::server
