// Internal: the MCP tools — their definitions for tools/list (JSON Schema for input and, where
// the result is structured, output) and their calls. Named sessions live in the Conversation.
//
//   run_code         code in a named session (started on first use; kernel or language chosen
//                    then), answered with text, PNG images, chart data and structured details
//   list_files / read_file / write_file    the session's work dir (its kernel's cwd)
//   restart_session  a fresh kernel under the same name: state is lost, files stay
//   close_session    the kernel is shut down
//   list_sessions    the conversation's sessions
//
// Thread-safety: call() never blocks: blocking work goes to `offload`, cells to the kernels'
// executor. `done` is called once, from any thread.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/client/kernels.hpp"
#include "cellgate/mcp/server.hpp"
#include "conversation.hpp"

namespace cellgate::mcp {

struct ToolCall {
  std::shared_ptr<Conversation> conversation;
  std::function<void()> keepalive;           // a cell still runs (optional)
  std::function<void(nlohmann::json)> done;  // the CallToolResult, once
};

class Tools {
 public:
  Tools(client::Kernels& kernels, util::Offload offload, ServerOptions options);

  // tools/list's "tools".
  const nlohmann::json& definitions() const { return definitions_; }
  bool has(const std::string& name) const;
  // Runs a tool (arguments: an object). The handle cancels it: a running cell is interrupted.
  std::shared_ptr<client::Cell> call(const std::string& name, const nlohmann::json& arguments,
                                     ToolCall call);
  // Shuts down every kernel of the conversation (blocking).
  void close_all(Conversation& conversation);

 private:
  class Pending;
  struct Target;
  void run_code(const nlohmann::json& args, ToolCall call, std::shared_ptr<Pending> pending);
  void run_in(const std::string& name, nlohmann::json request, Conversation::Named named,
              bool fresh, std::string note, ToolCall call, std::shared_ptr<Pending> pending,
              bool retried);
  nlohmann::json files_tool(const std::string& tool, const nlohmann::json& args,
                            Conversation& conversation);
  nlohmann::json session_tool(const std::string& tool, const nlohmann::json& args,
                              Conversation& conversation);
  // The session's kernel, started when `create`; a tool error's text otherwise.
  // A tenant's conversation: its limits, and the kernels it starts recorded as its own.
  Result<void> tenant_may_start(const Conversation& c) const;
  void tenant_owns(const Conversation& c, const std::string& kernel_id) const;
  Result<std::pair<Conversation::Named, bool>> ensure(Conversation& conversation,
                                                      const std::string& name, bool create,
                                                      const std::string& kernel,
                                                      const std::string& language);

  client::Kernels& kernels_;
  util::Offload offload_;
  const ServerOptions options_;
  nlohmann::json definitions_;
};

}  // namespace cellgate::mcp
