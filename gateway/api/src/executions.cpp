#include "executions.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/http/limits.hpp"
#include "cellgate/protocol/node_ids.hpp"

namespace cellgate::api {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool valid_eid(const std::string& eid) {
  return eid.size() == 32 && std::all_of(eid.begin(), eid.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

json page(const std::string& eid, const std::string& kernel_id, const std::string& state,
          const std::vector<json>& events, std::size_t after, bool truncated, const json& answer) {
  json out = json::array();
  for (std::size_t i = after; i < events.size(); ++i) {
    out.push_back(events[i]);
  }
  return json{{"execution_id", eid},      {"kernel_id", kernel_id}, {"state", state},
              {"events", std::move(out)}, {"next", events.size()},  {"truncated", truncated},
              {"answer", answer}};
}

}  // namespace

Executions::Executions(std::string dir) : dir_(std::move(dir)) {
  if (!dir_.empty() && ::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    spdlog::warn("detached cells: cannot make {} ({}); their events are kept in memory only", dir_,
                 std::strerror(errno));
  }
}

std::string Executions::begin(const std::string& kernel_id) {
  std::string eid = protocol::new_node_hex_id();
  auto e = std::make_shared<Execution>();
  e->kernel_id = kernel_id;
  {
    MutexLock lock(mu_);
    live_[eid] = e;
    order_.push_back(eid);
    while (live_.size() > kMaxKept) {  // the oldest finished one goes; running ones stay
      auto old = order_.begin();
      for (; old != order_.end(); ++old) {  // a loop, not a lambda: the lock analysis sees it
        auto it = live_.find(*old);
        if (it == live_.end() || it->second->done) {
          break;
        }
      }
      if (old == order_.end()) {
        break;
      }
      live_.erase(*old);
      order_.erase(old);
    }
  }
  prune_files();
  append_line(eid, json{{"kernel_id", kernel_id}});
  return eid;
}

void Executions::event(const std::string& eid, const json& event) {
  const std::string text = event.dump(-1, ' ', false, json::error_handler_t::replace);
  {
    MutexLock lock(mu_);
    auto it = live_.find(eid);
    if (it == live_.end()) {
      return;
    }
    Execution& e = *it->second;
    if (e.bytes + text.size() > kMaxBytes) {
      e.truncated = true;
      return;
    }
    e.bytes += text.size();
    e.events.push_back(event);
  }
  append_line(eid, json{{"event", event}});
}

void Executions::end(const std::string& eid, const execute::Answer& answer) {
  const json a = answer ? answer->to_json()
                        : json{{"status", "error"},
                               {"error", answer.error().reason},
                               {"message", answer.error().message}};
  {
    MutexLock lock(mu_);
    if (auto it = live_.find(eid); it != live_.end()) {
      it->second->done = true;
      it->second->answer = a;
    }
  }
  append_line(eid, json{{"end", a}});
}

Result<json> Executions::read(const std::string& kernel_id, const std::string& eid,
                              std::size_t after) const {
  std::shared_ptr<Execution> e;
  {
    MutexLock lock(mu_);
    if (auto it = live_.find(eid); it != live_.end()) {
      e = it->second;
    }
  }
  if (!e) {
    return read_file(kernel_id, eid, after);
  }
  MutexLock lock(mu_);  // events grow under it
  if (e->kernel_id != kernel_id) {
    return make_error(ErrorCode::kNotFound, "no_such_execution",
                      "kernel " + kernel_id + " has no execution " + eid);
  }
  return page(eid, kernel_id, e->done ? "done" : "running", e->events, after, e->truncated,
              e->answer);
}

void Executions::append_line(const std::string& eid, const json& line) const {
  if (dir_.empty()) {
    return;
  }
  const std::string path = dir_ + "/" + eid + ".ndjson";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return;  // said once at construction when the dir cannot be made
  }
  const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  (void)n;  // a full disk loses the record, not the cell
  ::close(fd);
}

Result<json> Executions::read_file(const std::string& kernel_id, const std::string& eid,
                                   std::size_t after) const {
  auto none = [&] {
    return protocol::unknown_id(kernel_id,
                                make_error(ErrorCode::kNotFound, "no_such_execution",
                                           "kernel " + kernel_id + " has no execution " + eid));
  };
  if (dir_.empty() || !valid_eid(eid)) {
    return none();
  }
  std::ifstream in(dir_ + "/" + eid + ".ndjson");
  if (!in) {
    return none();
  }
  std::vector<json> events;
  std::size_t bytes = 0;
  bool truncated = false;
  json answer;
  bool done = false;
  std::string owner;
  std::string text;
  while (std::getline(in, text)) {
    if (text.size() > kMaxBytes) {
      truncated = true;
      continue;
    }
    json line = http::parse_json(text);
    if (!line.is_object()) {
      continue;  // a line cut by a crash mid-write
    }
    if (line.contains("kernel_id") && line["kernel_id"].is_string()) {
      owner = line["kernel_id"].get<std::string>();
    } else if (line.contains("event")) {
      if (bytes + text.size() > kMaxBytes) {
        truncated = true;
        continue;
      }
      bytes += text.size();
      events.push_back(std::move(line["event"]));
    } else if (line.contains("end")) {
      answer = std::move(line["end"]);
      done = true;
    }
  }
  if (owner != kernel_id) {
    return none();
  }
  // Recorded by an earlier gateway: the end came (done) or it never will (interrupted).
  return page(eid, kernel_id, done ? "done" : "interrupted", events, after, truncated, answer);
}

void Executions::prune_files() const {
  if (dir_.empty()) {
    return;
  }
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().extension() == ".ndjson") {
      files.emplace_back(entry.last_write_time(ec), entry.path());
    }
    if (files.size() > 4 * kMaxFiles) {
      break;  // bounded work per start; the next ones prune the rest
    }
  }
  if (files.size() < kMaxFiles) {
    return;
  }
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i + kMaxFiles <= files.size(); ++i) {
    fs::remove(files[i].second, ec);
  }
}

}  // namespace cellgate::api
