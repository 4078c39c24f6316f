#include "cellgate/kernel/kernel.hpp"

#include <sys/mount.h>

#include <condition_variable>
#include <mutex>

#include "cellgate/kernel/client.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/proc.hpp"

namespace cellgate::kernel {

using nlohmann::json;

const char* to_string(RequestEnd end) {
  switch (end) {
    case RequestEnd::kComplete:
      return "complete";
    case RequestEnd::kKernelDead:
      return "kernel_dead";
    case RequestEnd::kCancelled:
      return "cancelled";
  }
  return "?";
}

std::string proc_stat_field(pid_t pid, int field) {
  auto text = sys::read_file("/proc/" + std::to_string(pid) + "/stat", 1 << 16, "proc_stat");
  return text ? sys::proc_stat_field(*text, field) : "";
}

std::string process_start_time(pid_t pid) {
  return proc_stat_field(pid, 22);
}

json AdoptionFacts::to_json() const {
  return json{{"launcher_pid", launcher_pid},
              {"launcher_start_time", launcher_start_time},
              {"kernel_pid", kernel_pid},
              {"jailed", jailed},
              {"runtime_dir", runtime_dir},
              {"status_file", status_file},
              {"log_file", log_file},
              {"work_dir", work_dir},
              {"cgroup_paths", cgroup_paths},
              {"cgroup_version", cgroup_version},
              {"connection", connection.to_json()},
              {"connection_file", connection_file}};
}

Result<AdoptionFacts> AdoptionFacts::from_json(const json& j) {
  try {
    AdoptionFacts f;
    f.launcher_pid = j.at("launcher_pid").get<pid_t>();
    f.launcher_start_time = j.at("launcher_start_time").get<std::string>();
    f.kernel_pid = j.at("kernel_pid").get<pid_t>();
    f.jailed = j.at("jailed").get<bool>();
    f.runtime_dir = j.at("runtime_dir").get<std::string>();
    f.status_file = j.at("status_file").get<std::string>();
    f.log_file = j.at("log_file").get<std::string>();
    f.work_dir = j.at("work_dir").get<std::string>();
    f.cgroup_paths = j.at("cgroup_paths").get<std::vector<std::string>>();
    f.cgroup_version = j.at("cgroup_version").get<std::string>();
    CELLGATE_ASSIGN_OR_RETURN(f.connection, ConnectionInfo::from_json(j.at("connection")));
    f.connection_file = j.at("connection_file").get<std::string>();
    return f;
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, "bad_record",
                      std::string("a kernel's adoption facts are incomplete: ") + e.what());
  }
}

json execute_content(std::string code, bool allow_stdin, bool store_history, bool silent) {
  return json{{"code", std::move(code)},        {"silent", silent},
              {"store_history", store_history}, {"user_expressions", json::object()},
              {"allow_stdin", allow_stdin},     {"stop_on_error", true}};
}

std::string KernelConnection::send(Channel channel, std::string_view msg_type, json content,
                                   RequestHandlers handlers) {
  return send(channel, session().make(msg_type, std::move(content)), std::move(handlers));
}

Result<Collected> KernelConnection::request(Channel channel, std::string_view msg_type,
                                            json content, std::chrono::milliseconds timeout,
                                            bool wait_for_idle) {
  struct Shared {
    Mutex mu;
    std::condition_variable_any cv;
    Collected collected CELLGATE_GUARDED_BY(mu);
    bool done CELLGATE_GUARDED_BY(mu) = false;
  };
  auto shared = std::make_shared<Shared>();
  RequestHandlers handlers;
  handlers.wait_for_idle = wait_for_idle;
  handlers.on_message = [shared, channel](Channel ch, const protocol::Message& msg) {
    MutexLock lock(shared->mu);
    shared->collected.messages.emplace_back(ch, msg);
    if (ch == channel) {
      shared->collected.reply = msg;
    }
  };
  handlers.on_end = [shared](RequestEnd end) {
    MutexLock lock(shared->mu);
    shared->collected.end = end;
    shared->done = true;
    shared->cv.notify_all();
  };
  send(channel, msg_type, std::move(content), std::move(handlers));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  UniqueLock lock(shared->mu);
  while (!shared->done) {
    if (shared->cv.wait_until(lock, deadline) == std::cv_status::timeout && !shared->done) {
      return make_error(ErrorCode::kDeadlineExceeded, "timeout",
                        std::string(msg_type) + " got no complete answer within " +
                            std::to_string(timeout.count()) + " ms");
    }
  }
  return std::move(shared->collected);
}

Result<std::unique_ptr<KernelConnection>> KernelBackend::connect(const KernelProcessHandle& process,
                                                                 ClientOptions options) {
  CELLGATE_ASSIGN_OR_RETURN(auto client,
                            KernelClient::connect(process.connection(), std::move(options)));
  return std::unique_ptr<KernelConnection>(std::move(client));
}

void KernelBackend::end_work_dir(const std::string& kernel_id, const std::string& work_dir) {
  (void)kernel_id;
  ::umount2(work_dir.c_str(), MNT_DETACH);
}

}  // namespace cellgate::kernel
