// Detached cells (README, "Agents"): POST /api/kernels/{id}/execute with {"detach": true}
// answers 202 with an execution id at once; the cell runs as any agent cell does, and its
// events are kept for GET /api/kernels/{id}/executions/{eid}?after=N to read from a cursor,
// while it runs and after. Each execution's events are also appended to
// <state-dir>/executions/<eid>.ndjson (0600), so a gateway started after a restart still
// answers with what was recorded before it (state "interrupted" when the end never came).
//
// Bounded: events of one execution past kMaxBytes are dropped ("truncated": true; the cell's
// own output caps come first), kMaxKept executions in memory (the oldest finished go first) and
// kMaxFiles files on disk (the oldest go).
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/execute/executor.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"

namespace cellgate::api {

class Executions {
 public:
  static constexpr std::size_t kMaxBytes = std::size_t{32} << 20;
  static constexpr std::size_t kMaxKept = 256;
  static constexpr std::size_t kMaxFiles = 1000;

  // `dir` "": in memory only.
  explicit Executions(std::string dir);

  // A new execution of `kernel_id`; its id (node-routable: protocol/node_ids.hpp).
  std::string begin(const std::string& kernel_id);
  void event(const std::string& eid, const nlohmann::json& event);
  void end(const std::string& eid, const execute::Answer& answer);

  // {"execution_id", "kernel_id", "state": running|done|interrupted, "events": [...after],
  //  "next": cursor for the next read, "truncated", "answer": the cell's answer or null}.
  // kNotFound for an id this kernel never had.
  Result<nlohmann::json> read(const std::string& kernel_id, const std::string& eid,
                              std::size_t after) const;

 private:
  struct Execution {
    std::string kernel_id;
    std::vector<nlohmann::json> events;
    std::size_t bytes = 0;
    bool truncated = false;
    bool done = false;
    nlohmann::json answer;
  };
  void append_line(const std::string& eid, const nlohmann::json& line) const;
  Result<nlohmann::json> read_file(const std::string& kernel_id, const std::string& eid,
                                   std::size_t after) const;
  void prune_files() const;

  const std::string dir_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Execution>> live_ CELLGATE_GUARDED_BY(mu_);
  std::deque<std::string> order_ CELLGATE_GUARDED_BY(mu_);  // oldest first
};

}  // namespace cellgate::api
