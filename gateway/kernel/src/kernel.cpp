#include "cellgate/kernel/kernel.hpp"

#include <condition_variable>
#include <mutex>

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

json execute_content(std::string code, bool allow_stdin, bool store_history, bool silent) {
  return json{{"code", std::move(code)},
              {"silent", silent},
              {"store_history", store_history},
              {"user_expressions", json::object()},
              {"allow_stdin", allow_stdin},
              {"stop_on_error", true}};
}

std::string KernelConnection::send(Channel channel, std::string_view msg_type, json content,
                                   RequestHandlers handlers) {
  return send(channel, session().make(msg_type, std::move(content)), std::move(handlers));
}

Result<Collected> KernelConnection::request(Channel channel, std::string_view msg_type,
                                            json content, std::chrono::milliseconds timeout,
                                            bool wait_for_idle) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    Collected collected;
    bool done = false;
  };
  auto shared = std::make_shared<Shared>();
  RequestHandlers handlers;
  handlers.wait_for_idle = wait_for_idle;
  handlers.on_message = [shared, channel](Channel ch, const protocol::Message& msg) {
    std::lock_guard lock(shared->mu);
    shared->collected.messages.emplace_back(ch, msg);
    if (ch == channel) {
      shared->collected.reply = msg;
    }
  };
  handlers.on_end = [shared](RequestEnd end) {
    std::lock_guard lock(shared->mu);
    shared->collected.end = end;
    shared->done = true;
    shared->cv.notify_all();
  };
  send(channel, msg_type, std::move(content), std::move(handlers));
  std::unique_lock lock(shared->mu);
  if (!shared->cv.wait_for(lock, timeout, [&] { return shared->done; })) {
    return make_error(ErrorCode::kDeadlineExceeded, "timeout",
                      std::string(msg_type) + " got no complete answer within " +
                          std::to_string(timeout.count()) + " ms");
  }
  return std::move(shared->collected);
}

}  // namespace cellgate::kernel
