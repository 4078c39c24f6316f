// A fake kernel behind the kernel seam (cellgate/kernel/kernel.hpp), for unit tests that run
// without root, without Python and without ZeroMQ: FakeBackend "launches" FakeProcesses and
// connects to them with the KernelClient that ships, over a fake transport
// (cellgate/kernel/transport.hpp) whose far end is the fake kernel: every unit test runs the
// gateway's own request router, iopub status tracking and heartbeat. The kernel answers on the
// client's I/O thread with messages shaped after the ipykernel 6 traffic captured in
// tests/fixtures/ipykernel/*.json (same header fields, same content keys, the request's header
// as parent_header), encoded and signed with the connection's key; what the client sends it
// arrives signed and is verified, so the real codec paths run.
//
// What the fake kernel does:
//   kernel_info_request  → status busy, kernel_info_reply (the captured content), status idle
//   execute_request      → status busy, execute_input (unless silent), what the responder's
//                          FakeCell says, execute_reply (ok, or error with ename/evalue/
//                          traceback), status idle. One cell at a time; later shell requests
//                          wait behind a running one, as in ipykernel.
//   interrupt_request    → (control) interrupt_reply, and the running cell is interrupted
//   shutdown_request     → (control) shutdown_reply; then the process exits with code 0
//   other *_request      → the matching *_reply {"status": "ok"} between busy and idle
//   SIGINT (FakeProcess::signal) → the running cell is interrupted
// An interrupted cell that sleeps, hangs or waits for input ends with error KeyboardInterrupt;
// a cell made with hang_ignoring_interrupts() runs until the kernel dies.
//
// The responder API: a function from the cell's code to a FakeCell, a list of steps.
//
//   using cellgate::testing::FakeCell;
//   cellgate::testing::FakeBackend fake([](const std::string& code) {
//     if (code == "print('hi')") return FakeCell().out("hi\n");
//     if (code == "1+2") return FakeCell().result({{"text/plain", "3"}});
//     if (code == "1/0") return FakeCell().error("ZeroDivisionError", "division by zero");
//     if (code == "plot()") return FakeCell().display({{"image/png", png_b64}});
//     if (code == "input()") {
//       return FakeCell().input("Name: ", [](const std::string& value, FakeCell& rest) {
//         rest.out("hello " + value + "\n");
//       });
//     }
//     if (code == "while True: pass") return FakeCell().hang();       // until interrupted
//     if (code == "stuck()") return FakeCell().hang_ignoring_interrupts();
//     if (code == "time.sleep(1)") return FakeCell().sleep(std::chrono::seconds(1));
//     return FakeCell();                                              // ok, no output
//   });
//   kernel::KernelBackend& backend = fake;       // what the registry or the executor takes
//   … start a kernel through the code under test …
//   fake.kernel(0)->kill("oom");                 // the process ends; the connection is told
//   fake.kernel(0)->stop_heartbeat();            // pings go unanswered: the client's heartbeat
//                                                // declares it dead
//   fake.kernel(0)->signals();                   // {SIGINT} after an interrupt
//   fake.fail_next_launch("no cgroup");          // the next launch() returns an error
//   fake.set_launch_delay(200ms);                // launch() blocks that long (pool tests)
//   ASSERT_TRUE(eventually([&] { return fake.launches() == 2; }));
//
// Thread-safety: every method may be called from any thread. Handlers given to a connection run
// on that connection's I/O thread, one at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernel/process.hpp"

namespace cellgate::testing {

// Polls `pred` every millisecond until it is true or `timeout` passes; returns its last value.
// The timeout only bounds a wait that fails (no test expects it to pass): 60 s, because 5 s was
// too short for a 20 MiB signing workload under ASan on a busy 2-core machine.
bool eventually(const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = std::chrono::seconds(60));

// What one execute_request does, step by step. Steps run in order; error() ends the cell.
class FakeCell {
 public:
  // Called when the input_request is answered: append what the cell does next to `rest`.
  using AfterInput = std::function<void(const std::string& value, FakeCell& rest)>;

  struct Step {
    enum class Kind { kIopub, kError, kInput, kSleep, kHang, kHangHard, kDie };
    Kind kind = Kind::kIopub;
    std::string msg_type;                   // kIopub
    nlohmann::json content;                 // kIopub
    std::string ename;                      // kError
    std::string evalue;                     // kError
    std::vector<std::string> traceback;     // kError
    std::string prompt;                     // kInput
    bool password = false;                  // kInput
    AfterInput then;                        // kInput
    std::chrono::milliseconds duration{0};  // kSleep
    std::string reason;                     // kDie
  };

  FakeCell& out(std::string text);  // stream stdout
  FakeCell& err(std::string text);  // stream stderr
  FakeCell& display(nlohmann::json data, nlohmann::json metadata = nlohmann::json::object());
  FakeCell& result(nlohmann::json data);  // execute_result with the cell's execution_count
  // error on iopub, then execute_reply status "error"; the cell ends here. traceback defaults
  // to the captured one's shape: a rule, then "<ename>: <evalue>".
  FakeCell& error(std::string ename, std::string evalue, std::vector<std::string> traceback = {});
  // Any other iopub message (clear_output, comm_open, update_display_data, …).
  FakeCell& iopub(std::string msg_type, nlohmann::json content);
  // input_request on stdin; waits for the input_reply (KernelConnection::send_input, or a
  // client's input_reply posted on stdin). Interrupting it raises KeyboardInterrupt.
  FakeCell& input(std::string prompt, AfterInput then = {}, bool password = false);
  // Real time, on the connection's thread; an interrupt cuts it short (KeyboardInterrupt).
  FakeCell& sleep(std::chrono::milliseconds duration);
  // Until interrupted (then KeyboardInterrupt), or until the kernel dies.
  FakeCell& hang();
  // Until the kernel dies: interrupts are recorded and ignored.
  FakeCell& hang_ignoring_interrupts();
  // The kernel dies here, as FakeKernel::kill(reason).
  FakeCell& die(std::string reason = "the kernel died in a cell");

  std::vector<Step> steps;
};

// The code of an execute_request → what it does.
using Responder = std::function<FakeCell(const std::string& code)>;

class FakeWire;  // fake_kernel.cpp: how other threads reach a connection's kernel

// One launched kernel, as the test sees it. Shared by its FakeProcess, its connection and
// the FakeBackend (which keeps it after the process is gone, for assertions).
class FakeKernel {
 public:
  FakeKernel(pid_t pid, kernel::LaunchRequest request, Responder responder);

  pid_t pid() const { return pid_; }
  // What the launch asked for (spec, env, work dir, jail), as the code under test built it.
  const kernel::LaunchRequest& request() const { return request_; }

  // Signals sent through FakeProcess::signal, in order.
  std::vector<int> signals() const;
  // Every message the kernel received, as "<channel>:<msg_type>" ("shell:execute_request").
  std::vector<std::string> received() const;
  // The code of every execute_request it ran or is running, in order.
  std::vector<std::string> executed() const;
  // Interrupts that reached the kernel (SIGINT or interrupt_request), running cell or not.
  int interrupts() const;
  // Whether a cell is running now (between its busy and its reply).
  bool cell_running() const;
  // Whether the process still runs (not killed, exited, or shut down).
  bool running() const;
  // Whether heartbeats are answered (false once it died or stop_heartbeat() was called).
  bool heartbeating() const;
  int execution_count() const;

  // The process ends (poll_exit reports reason signaled, signal 9, message `reason`) and the
  // connection's transport says the kernel is gone (TransportEvents::on_peer_gone): the client
  // calls on_dead(reason) and requests in flight end kKernelDead.
  void kill(const std::string& reason = "killed by the test");
  // The process exits by itself with `code` (reason ok); heartbeats stop.
  void exit(int code = 0);
  // Heartbeats go unanswered while the process keeps running: the client's heartbeat declares
  // the kernel dead after ClientOptions::heartbeat_misses pings (on_dead with its reason).
  void stop_heartbeat();
  // The next kernel_info_requests go unanswered (wait_ready times out) while `silent`.
  void set_unresponsive(bool silent);
  // Replaces the responder for cells that start from now on.
  void set_responder(Responder responder);
  // The next cell that is not silent stops right after its `status: busy`, before its
  // execute_input, as ipykernel does before it installs its SIGINT handler (it ignores SIGINT
  // between cells): a SIGINT meanwhile is recorded and dropped. release_cell() lets it go on.
  void hold_next_cell();
  void release_cell();
  // Whether a held cell waits (its busy is published).
  bool cell_held() const;
  // The CPU time its cgroup reports (FakeProcess::cgroup_stats), from now on: a fake kernel has
  // no cgroup until a test gives it one this way.
  void set_cpu_usage(std::chrono::microseconds used);
  std::optional<std::chrono::microseconds> cpu_usage() const;

  // ---- for FakeProcess and the fake transport ----
  void record_signal(int sig);
  void record_interrupt();
  void record_received(const std::string& what);
  void record_executed(const std::string& code);
  std::optional<launcher::StatusEvent> exit_event() const;
  std::optional<launcher::StatusEvent> wait_exit(std::chrono::milliseconds timeout) const;
  void attach(const std::shared_ptr<FakeWire>& connection);
  void set_cell_running(bool running);
  bool take_hold();
  void set_cell_held(bool held);
  int next_execution_count();
  bool unresponsive() const;
  Responder responder() const;

 private:
  void end(launcher::StatusEvent event, const std::string& reason);
  std::shared_ptr<FakeWire> connection() const;

  const pid_t pid_;
  const kernel::LaunchRequest request_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Responder responder_;
  std::vector<int> signals_;
  std::optional<std::chrono::microseconds> cpu_usage_;
  std::vector<std::string> received_;
  std::vector<std::string> executed_;
  int interrupts_ = 0;
  int execution_count_ = 0;
  bool cell_running_ = false;
  bool hold_next_ = false;
  bool cell_held_ = false;
  bool heartbeating_ = true;
  bool unresponsive_ = false;
  std::optional<launcher::StatusEvent> exited_;
  std::weak_ptr<FakeWire> connection_;
};

// The process handle: a fake pid, recorded signals, a death the test triggers. Destroying it
// ends the kernel, as destroying a KernelProcess kills the real one.
class FakeProcess : public kernel::KernelProcessHandle {
 public:
  explicit FakeProcess(std::shared_ptr<FakeKernel> kernel);
  ~FakeProcess() override;

  pid_t pid() const override { return kernel_->pid(); }
  bool jailed() const override { return false; }
  const kernel::ConnectionInfo& connection() const override { return info_; }
  const std::string& connection_file() const override { return connection_file_; }
  std::string log_tail(std::size_t max_bytes = 2000) const override;
  Result<jail::CgroupStats> cgroup_stats() const override;
  Result<void> signal(int sig) override;
  std::optional<launcher::StatusEvent> poll_exit() override;
  std::optional<launcher::StatusEvent> wait_exit(std::chrono::milliseconds timeout) override;

  const std::shared_ptr<FakeKernel>& kernel() const { return kernel_; }

 private:
  std::shared_ptr<FakeKernel> kernel_;
  kernel::ConnectionInfo info_;
  std::string connection_file_;
};

class FakeBackend : public kernel::KernelBackend {
 public:
  // `responder` answers every kernel's cells (default: every cell succeeds silently).
  explicit FakeBackend(Responder responder = {});
  ~FakeBackend() override;

  void start() override;
  void tick() override;
  bool wait_fast(std::chrono::milliseconds timeout) override;
  Result<std::unique_ptr<kernel::KernelProcessHandle>> launch(
      kernel::LaunchRequest request) override;
  Result<std::unique_ptr<kernel::KernelConnection>> connect(
      const kernel::KernelProcessHandle& process, kernel::ClientOptions options) override;

  // ---- knobs ----
  // The next `count` launches fail with kInternal "kernel_start_failed" and `message`.
  void fail_next_launch(std::string message = "the fake launch failed", int count = 1);
  // Every launch blocks this long before it returns (as a cold start does).
  void set_launch_delay(std::chrono::milliseconds delay);
  // Kernels launched from now on start unresponsive (see FakeKernel::set_unresponsive).
  void set_next_unresponsive(bool silent);
  // What wait_fast() answers once start() ran (default true, at once).
  void set_fast(bool fast);
  // For cells that start from now on, in every kernel (FakeKernel::set_responder for one).
  void set_responder(Responder responder);

  // ---- what happened ----
  int launches() const;  // launch() calls, failed ones included
  // The most launch() calls in progress at once (with a launch delay), since the last reset.
  int most_concurrent_launches() const;
  void reset_most_concurrent_launches();
  int connects() const;
  int ticks() const;
  bool started() const;
  // Launched kernels, in launch order (failed launches have none).
  std::vector<std::shared_ptr<FakeKernel>> kernels() const;
  std::shared_ptr<FakeKernel> kernel(std::size_t index) const;  // null when out of range
  std::shared_ptr<FakeKernel> find(pid_t pid) const;            // null when unknown
  // Kills the kernel with this pid (FakeKernel::kill); false when unknown.
  bool kill(pid_t pid, const std::string& reason = "killed by the test");

 private:
  mutable std::mutex mu_;
  Responder responder_;
  std::vector<std::shared_ptr<FakeKernel>> kernels_;
  int launches_ = 0;
  int launching_ = 0;
  int most_launching_ = 0;
  int connects_ = 0;
  int ticks_ = 0;
  bool started_ = false;
  bool fast_ = true;
  bool next_unresponsive_ = false;
  int fail_count_ = 0;
  std::string fail_message_;
  std::chrono::milliseconds launch_delay_{0};
  pid_t next_pid_ = 700000;
};

}  // namespace cellgate::testing
