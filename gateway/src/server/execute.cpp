#include "cellgate/server/execute.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <regex>
#include <sstream>

#include "cellgate/text.hpp"

namespace cellgate::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kernel::Channel;

std::size_t bundle_size(const json& data) {
  std::size_t n = 0;
  if (data.is_object()) {
    for (const auto& [mime, value] : data.items()) {
      n += mime.size() + (value.is_string() ? value.get_ref<const std::string&>().size()
                                            : value.dump().size());
    }
  }
  return n;
}

// Everything one cell produced, capped as it arrives. Shared with the kernel client's I/O
// thread, which may still deliver after the HTTP answer went out.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  ExecuteLimits limits;
  std::deque<std::string> stdin_lines;
  std::shared_ptr<kernel::KernelClient> client;

  std::string out[2];  // stdout, stderr
  bool out_truncated[2] = {false, false};
  bool outputs_truncated = false;
  std::size_t dropped_bytes = 0;
  json outputs = json::array();
  json result;  // null
  json error;   // null
  std::optional<json> reply;
  bool done = false;
  kernel::RequestEnd end = kernel::RequestEnd::kComplete;

  void add_output(json output) {
    if (outputs.size() >= limits.outputs) {
      outputs_truncated = true;
      dropped_bytes += output.dump().size();
      return;
    }
    outputs.push_back(std::move(output));
  }

  void on_stream(const json& c) {
    const int which = c.value("name", "stdout") == "stderr" ? 1 : 0;
    const std::string& text = c.contains("text") && c["text"].is_string()
                                  ? c["text"].get_ref<const std::string&>()
                                  : std::string();
    std::string& buf = out[which];
    const std::size_t room = limits.stream_bytes > buf.size() ? limits.stream_bytes - buf.size() : 0;
    const std::string kept = text.substr(0, room);
    if (kept.size() < text.size()) {
      out_truncated[which] = true;
      dropped_bytes += text.size() - kept.size();
    }
    if (kept.empty()) {
      return;
    }
    buf += kept;
    const char* name = which == 1 ? "stderr" : "stdout";
    // nbformat keeps consecutive text of one stream in one output.
    if (!outputs.empty() && outputs.back().value("output_type", "") == "stream" &&
        outputs.back().value("name", "") == name) {
      outputs.back()["text"] = outputs.back()["text"].get<std::string>() + kept;
    } else {
      add_output(json{{"output_type", "stream"}, {"name", name}, {"text", kept}});
    }
  }

  void on_bundle(const std::string& type, const json& c) {
    json data = c.value("data", json::object());
    json metadata = c.value("metadata", json::object());
    const std::size_t size = bundle_size(data);
    if (size > limits.output_bytes) {
      outputs_truncated = true;
      dropped_bytes += size;
      data = json{{"text/plain", "<" + std::to_string(size) + " bytes of output dropped: over the "
                                 "per-output limit of " + std::to_string(limits.output_bytes) +
                                 " bytes>"}};
    }
    json output = {{"output_type", type == "execute_result" ? "execute_result" : "display_data"},
                   {"data", data},
                   {"metadata", metadata}};
    if (type == "execute_result") {
      output["execution_count"] = c.value("execution_count", json());
      result = data;
    }
    add_output(std::move(output));
  }

  void on_error(const json& c) {
    std::vector<std::string> traceback;
    if (auto t = c.find("traceback"); t != c.end() && t->is_array()) {
      for (const auto& line : *t) {
        if (line.is_string()) {
          traceback.push_back(strip_ansi(line.get<std::string>()));
        }
      }
    }
    add_output(json{{"output_type", "error"},
                    {"ename", c.value("ename", "")},
                    {"evalue", c.value("evalue", "")},
                    {"traceback", traceback}});
    error = json{{"ename", c.value("ename", "")},
                 {"evalue", c.value("evalue", "")},
                 {"traceback", traceback}};
    if (int line = failing_line(traceback); line > 0) {
      error["line"] = line;
    }
  }

  void on_message(Channel channel, const protocol::Message& msg) {
    const std::string type = msg.msg_type();
    std::unique_lock lock(mu);
    if (channel == Channel::kShell && type == "execute_reply") {
      reply = msg.content;
    } else if (channel == Channel::kStdin && type == "input_request") {
      std::string answer;
      if (!stdin_lines.empty()) {
        answer = std::move(stdin_lines.front());
        stdin_lines.pop_front();
      }
      auto c = client;
      lock.unlock();
      if (c) {
        c->send_input(msg, answer);
      }
    } else if (type == "stream") {
      on_stream(msg.content);
    } else if (type == "execute_result" || type == "display_data" ||
               type == "update_display_data") {
      on_bundle(type, msg.content);
    } else if (type == "error") {
      on_error(msg.content);
    } else if (type == "clear_output") {
      outputs = json::array();
    }
  }
};

}  // namespace

int failing_line(const std::vector<std::string>& traceback) {
  // IPython marks the failing line of the cell with an arrow: "----> 3 x = d['k']".
  static const std::regex arrow(R"(^-*>\s*(\d+))");
  static const std::regex cell_line(R"(Cell In\s*\[\d*\],\s*line\s+(\d+))");
  int line = 0;
  for (const auto& entry : traceback) {
    std::smatch m;
    std::istringstream lines(entry);
    for (std::string l; std::getline(lines, l);) {
      if (std::regex_search(l, m, cell_line) || std::regex_search(l, m, arrow)) {
        line = std::stoi(m[1].str());
        return line;  // the first frame is the cell itself
      }
    }
  }
  return line;
}

Result<ExecuteRequest> ExecuteRequest::from_json(const json& body, double max_timeout) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_request", what);
  };
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

Result<json> execute_cell(KernelManager& manager, const std::string& kernel_id,
                          const ExecuteRequest& request, const ExecuteLimits& limits) {
  CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager.find(kernel_id));
  auto client = kernel->client();
  if (!client) {
    return make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                      "kernel " + kernel_id + " is " + kernel->model().execution_state);
  }
  const auto started = Clock::now();
  auto collector = std::make_shared<Collector>();
  collector->limits = limits;
  collector->client = client;
  collector->stdin_lines.assign(request.stdin_lines.begin(), request.stdin_lines.end());

  kernel::RequestHandlers handlers;
  handlers.on_message = [collector](Channel ch, const protocol::Message& msg) {
    collector->on_message(ch, msg);
  };
  handlers.on_end = [collector](kernel::RequestEnd end) {
    std::lock_guard lock(collector->mu);
    collector->done = true;
    collector->end = end;
    collector->client.reset();
    collector->cv.notify_all();
  };
  json content = kernel::execute_content(request.code, !request.stdin_lines.empty(),
                                         request.store_history);
  content["stop_on_error"] = false;  // one agent call must not abort the next one
  client->send(Channel::kShell, "execute_request", std::move(content), std::move(handlers));
  client.reset();

  const auto deadline =
      started + std::chrono::milliseconds(static_cast<long long>(request.timeout_seconds * 1000));
  bool timed_out = false;
  bool state_lost = false;
  {
    std::unique_lock lock(collector->mu);
    if (!collector->cv.wait_until(lock, deadline, [&] { return collector->done; })) {
      timed_out = true;
    }
  }
  if (timed_out) {
    // Interrupt, give the cell the grace period to stop, then restart the kernel.
    (void)manager.interrupt(kernel_id);
    std::unique_lock lock(collector->mu);
    if (!collector->cv.wait_for(lock, limits.grace, [&] { return collector->done; })) {
      lock.unlock();
      auto restarted = manager.restart(kernel_id);
      state_lost = true;
      if (!restarted) {
        lock.lock();
        collector->done = true;
      }
    }
  }

  std::lock_guard lock(collector->mu);
  std::string status;
  if (timed_out) {
    status = "timeout";
  } else if (collector->end == kernel::RequestEnd::kKernelDead) {
    status = "dead";
    state_lost = true;
  } else if (collector->reply) {
    status = collector->reply->value("status", "error");
  } else {
    status = "dead";
    state_lost = true;
  }
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  json answer = {
      {"status", status},
      {"execution_count",
       collector->reply ? collector->reply->value("execution_count", json()) : json()},
      {"stdout", collector->out[0]},
      {"stderr", collector->out[1]},
      {"outputs", collector->outputs},
      {"result", collector->result},
      {"error", collector->error},
      {"artifacts", json::array()},
      {"truncated",
       {{"stdout", collector->out_truncated[0]},
        {"stderr", collector->out_truncated[1]},
        {"outputs", collector->outputs_truncated},
        {"dropped_bytes", collector->dropped_bytes}}},
      {"state_lost", state_lost},
      {"metrics", {{"wall_ms", wall.count()}}}};
  if (timed_out) {
    answer["message"] = state_lost ? "the cell ran past its timeout and did not stop when "
                                     "interrupted: the kernel was restarted and its state is lost"
                                   : "the cell ran past its timeout and was interrupted; the "
                                     "kernel's state is kept";
  }
  return answer;
}

}  // namespace cellgate::server
