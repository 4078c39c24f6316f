// Collector: everything one agent cell produced — stdout, stderr, nbformat outputs, the result,
// the error, artifacts, notices — capped as it arrives (ExecuteLimits), and passed on as events
// to the cell's sink. The answer's capture fields come from here.
//
//   Collector c(limits, on_event, &artifacts, kernel_id);
//   c.on_message("stream", content);          // {"name": "stdout", "text": "hi\n"}
//   c.fields(result);                         // stdout, outputs, truncation, … of a CellResult
//
// Artifacts (images, PDFs) are decoded, hashed and written by ArtifactStore::put from
// on_message, so the collector runs where the cell does (its strand), never on a kernel's I/O
// thread.
//
// Thread-safety: none; one cell's strand uses it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/execute/executor.hpp"

namespace cellgate::execute {

class Collector {
 public:
  using Sink = std::function<void(const nlohmann::json& event)>;

  Collector(ExecuteLimits limits, Sink sink, store::ArtifactStore* artifacts,
            std::string kernel_id);

  // Whether an iopub message of this type is captured (the rest — status, comms — need not be
  // parsed).
  static bool captures(std::string_view msg_type);
  // One iopub message of the cell (execute_input, stream, execute_result, display_data,
  // update_display_data, error, clear_output); other types are ignored. The content comes from a
  // kernel: fields of the wrong type are treated as absent.
  void on_message(std::string_view msg_type, const nlohmann::json& content);
  // A stream message's content frame as it came, read with simdjson for its name and text
  // only: a 1 MiB write costs a fraction of a DOM parse, so a cell flooding stdout does not
  // back its strand up. False when the frame is not a JSON object (then use on_message).
  bool on_stream_frame(std::string_view content);
  // An event of the cell's own (keepalive): sent on as it is.
  void emit(const nlohmann::json& event);
  // No event reaches the sink after this (the answer is made).
  void close() { sink_ = nullptr; }

  // Sets stdout, stderr, outputs, result, error, artifacts, charts, data, notices and truncated
  // of `result`.
  void fields(CellResult& result) const;

  const nlohmann::json& execution_count() const { return execution_count_; }
  const std::optional<CellError>& error() const { return error_; }
  const nlohmann::json& artifacts() const { return artifacts_; }
  std::size_t stdout_bytes() const { return out_[0].size(); }
  std::size_t stderr_bytes() const { return out_[1].size(); }
  std::size_t dropped_bytes() const { return dropped_bytes_; }

 private:
  void notice(const std::string& key, const std::string& message);
  void notice_dropped(std::string_view text);
  bool add_output(nlohmann::json output, std::size_t bytes);
  bool over_total(std::size_t more) const;
  void on_stream(int which, std::string_view text);  // 0: stdout, 1: stderr
  nlohmann::json store_artifacts(const nlohmann::json& data);
  void on_bundle(std::string_view type, const nlohmann::json& c);
  void on_error(const nlohmann::json& c);

  const ExecuteLimits limits_;
  Sink sink_;
  store::ArtifactStore* artifacts_store_;
  const std::string kernel_id_;

  std::string out_[2];  // stdout, stderr
  bool out_truncated_[2] = {false, false};
  bool outputs_truncated_ = false;
  std::size_t dropped_bytes_ = 0;
  nlohmann::json outputs_ = nlohmann::json::array();
  std::vector<std::size_t> output_sizes_;  // bytes of each output, as counted in kept_bytes_
  std::size_t kept_bytes_ = 0;             // against ExecuteLimits::total_output_bytes
  std::map<std::string, std::vector<std::size_t>> displays_;  // display_id → output indices
  nlohmann::json result_;                                     // null
  std::optional<CellError> error_;
  nlohmann::json artifacts_ = nlohmann::json::array();
  // What the kernel's display formatters added (kernels/display_formatters.hpp), in order: each
  // displayed figure's chart and each DataFrame's columns.
  nlohmann::json charts_ = nlohmann::json::array();
  nlohmann::json data_ = nlohmann::json::array();
  std::vector<std::string> notices_;
  std::set<std::string> noticed_;   // reasons already noticed, so each is said once
  nlohmann::json execution_count_;  // from execute_input, for the artifacts of display_data
};

}  // namespace cellgate::execute
