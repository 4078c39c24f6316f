#include "output_log.hpp"

#include <cstdio>
#include <utility>

namespace cellgate::notebooks {

using nlohmann::json;

std::string OutputLog::text_of(const json& event) {
  if (!event.is_object()) {
    return {};
  }
  const std::string type = event.value("type", "");
  if (type == "stream") {
    auto text = event.find("text");
    return text != event.end() && text->is_string() ? text->get<std::string>() : std::string();
  }
  if (type == "execute_result" || type == "display_data") {
    auto data = event.find("data");
    if (data == event.end() || !data->is_object() || data->empty()) {
      return {};
    }
    auto plain = data->find("text/plain");
    if (plain != data->end() && plain->is_string()) {
      return plain->get<std::string>() + "\n";
    }
    return "<" + data->begin().key() + ">\n";
  }
  if (type == "error") {
    std::string text;
    if (auto tb = event.find("traceback"); tb != event.end() && tb->is_array()) {
      for (const auto& line : *tb) {
        if (line.is_string()) {
          text += line.get<std::string>() + "\n";
        }
      }
    }
    return text;
  }
  return {};
}

void OutputLog::start() {
  thread_ = std::thread([this] { write_all(); });
}

void OutputLog::add(const json& event) {
  std::string text = text_of(event);
  if (text.empty()) {
    return;
  }
  MutexLock lock(mu_);
  if (queued_ + text.size() > kMaxQueuedBytes) {
    dropped_ += text.size();
    return;
  }
  queued_ += text.size();
  queue_.push_back(std::move(text));
  cv_.notify_one();
}

void OutputLog::stop() {
  if (!thread_.joinable()) {
    return;
  }
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void OutputLog::write_all() {
  UniqueLock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&]() CELLGATE_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      break;  // stopping, and everything is written
    }
    std::deque<std::string> batch;
    batch.swap(queue_);
    queued_ = 0;
    lock.unlock();
    for (const auto& text : batch) {
      std::fwrite(text.data(), 1, text.size(), stderr);
    }
    std::fflush(stderr);
    lock.lock();
  }
  if (dropped_ > 0) {
    std::fprintf(stderr,
                 "cellgate run: --log-output dropped %zu bytes of output (stderr was slow)\n",
                 dropped_);
  }
}

}  // namespace cellgate::notebooks
