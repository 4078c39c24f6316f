// Internal: `cellgate run --log-output`, the cells' outputs on stderr as they arrive (papermill's
// --log-output). Events are delivered on the engine's strands, which must not block on a slow
// stderr: add() queues the text (up to kMaxQueuedBytes; past that it is dropped, and a line at
// the end says how much) and a thread of the log's own writes it.
//
//   OutputLog log;
//   log.start();
//   run.on_event = [&log](const nlohmann::json& e) { log.add(e); };
//   …
//   log.stop();   // writes what is queued, then joins (the destructor does too)
//
// What is written: stream text as it is; an execute_result's or display_data's text/plain (else
// "<mime>" of its first type) and a newline; an error's traceback. Other events are not logged.
//
// Thread-safety: add() from any thread; start() and stop() from the owner's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cellgate/mutex.hpp"

namespace cellgate::notebooks {

class OutputLog {
 public:
  static constexpr std::size_t kMaxQueuedBytes = std::size_t{4} << 20;

  OutputLog() = default;
  ~OutputLog() { stop(); }
  OutputLog(const OutputLog&) = delete;
  OutputLog& operator=(const OutputLog&) = delete;

  void start();
  void add(const nlohmann::json& event) CELLGATE_EXCLUDES(mu_);
  void stop() CELLGATE_EXCLUDES(mu_);

  // The text an event logs ("" for none).
  static std::string text_of(const nlohmann::json& event);

 private:
  void write_all() CELLGATE_EXCLUDES(mu_);

  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::string> queue_ CELLGATE_GUARDED_BY(mu_);
  std::size_t queued_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::size_t dropped_ CELLGATE_GUARDED_BY(mu_) = 0;
  bool stopping_ CELLGATE_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cellgate::notebooks
