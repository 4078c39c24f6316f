#include "papermill.hpp"

#include <cstdio>
#include <ctime>

namespace cellgate::notebooks::papermill {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

json& metadata_of(json& holder) {
  if (!holder.contains("metadata") || !holder["metadata"].is_object()) {
    holder["metadata"] = json::object();
  }
  return holder["metadata"];
}

}  // namespace

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                          now - std::chrono::system_clock::from_time_t(t))
                          .count();
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[48];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06ld", static_cast<long>(micros));
  return buf;
}

void describe(json& nb, const std::vector<notebook::Parameter>& parameters,
              const std::string& input_path, const std::string& output_path) {
  json params = json::object();
  for (const auto& p : parameters) {
    params[p.name] = p.value;
  }
  metadata_of(nb)["papermill"] = {{"parameters", std::move(params)},
                                  {"input_path", input_path},
                                  {"output_path", output_path.empty() ? json() : json(output_path)},
                                  {"environment_variables", json::object()},
                                  {"default_parameters", json::object()}};
}

Tracker::Tracker(json& nb, const std::vector<notebook::Parameter>& parameters,
                 const std::string& input_path, const std::string& output_path)
    : nb_(nb), started_(Clock::now()) {
  describe(nb_, parameters, input_path, output_path);
  json& m = metadata_of(nb_)["papermill"];
  m["start_time"] = utc_now();
  m["end_time"] = nullptr;
  m["duration"] = nullptr;
  m["exception"] = nullptr;
  for (std::size_t i = 0; i < nb_["cells"].size(); ++i) {
    cell_metadata(i) = {{"start_time", nullptr},
                        {"end_time", nullptr},
                        {"duration", nullptr},
                        {"status", "pending"},
                        {"exception", nullptr}};
  }
}

json& Tracker::cell_metadata(std::size_t index) {
  return metadata_of(nb_["cells"][index])["papermill"];
}

void Tracker::pass_to(std::size_t index) {
  for (; next_ < index && next_ < nb_["cells"].size(); ++next_) {
    const std::string now = utc_now();
    json& m = cell_metadata(next_);
    m["start_time"] = now;
    m["end_time"] = now;
    m["duration"] = 0.0;
    m["status"] = "completed";
    m["exception"] = false;
  }
}

void Tracker::start(std::size_t index) {
  pass_to(index);
  json& m = cell_metadata(index);
  m["start_time"] = utc_now();
  m["status"] = "running";
  m["exception"] = false;
  cell_started_ = Clock::now();
  next_ = index + 1;
}

void Tracker::end(std::size_t index, bool failed) {
  json& m = cell_metadata(index);
  m["end_time"] = utc_now();
  m["duration"] = seconds(Clock::now() - cell_started_);
  m["status"] = failed ? "failed" : "completed";
  m["exception"] = failed;
  failed_ = failed_ || failed;
}

void Tracker::finish(bool reached_end) {
  if (reached_end) {
    pass_to(nb_["cells"].size());
  }
  json& m = metadata_of(nb_)["papermill"];
  m["end_time"] = utc_now();
  m["duration"] = seconds(Clock::now() - started_);
  m["exception"] = failed_ ? json(true) : json(nullptr);
}

}  // namespace cellgate::notebooks::papermill
