#include "cellgate/testing/fake_kernel.hpp"

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/transport.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kernel::Channel;

// ---- the captured ipykernel traffic ----------------------------------------------------------

struct Fixtures {
  protocol::Message kernel_info_reply;
  protocol::Message execute_reply;        // status ok
  protocol::Message execute_reply_error;  // status error
  protocol::Message status;
  protocol::Message stream;
  protocol::Message execute_result;
  protocol::Message display_data;
  protocol::Message error;
};

[[noreturn]] void fixture_failure(const std::string& what) {
  std::fprintf(stderr, "fake_kernel: %s\n", what.c_str());
  std::abort();
}

// A fixture file (tests/fixtures/ipykernel/README.md) decoded with the real codec.
protocol::Message load_fixture(const std::string& name) {
  const std::string path = std::string(CELLGATE_FIXTURES_DIR) + "/ipykernel/" + name + ".json";
  std::ifstream in(path);
  if (!in) {
    fixture_failure("cannot read " + path);
  }
  json record = json::parse(in, nullptr, false);
  if (record.is_discarded() || !record.contains("frames_b64")) {
    fixture_failure(path + " is not a captured message");
  }
  std::vector<std::string> frames;
  for (const auto& b64 : record["frames_b64"]) {
    auto bytes = base64_decode(b64.get<std::string>());
    if (!bytes) {
      fixture_failure(path + ": bad base64");
    }
    frames.push_back(std::move(*bytes));
  }
  auto signer = protocol::Signer::create(record.value("signature_scheme", "hmac-sha256"),
                                         record.value("key", ""));
  if (!signer) {
    fixture_failure(path + ": " + signer.error().describe());
  }
  auto msg = protocol::decode(frames, *signer);
  if (!msg) {
    fixture_failure(path + ": " + msg.error().describe());
  }
  return std::move(msg).value();
}

const Fixtures& fixtures() {
  static const Fixtures f = [] {
    Fixtures out;
    out.kernel_info_reply = load_fixture("kernel_info_reply");
    out.execute_reply = load_fixture("execute_reply");
    out.execute_reply_error = load_fixture("execute_reply_error");
    out.status = load_fixture("status_busy");
    out.stream = load_fixture("stream");
    out.execute_result = load_fixture("execute_result");
    out.display_data = load_fixture("display_data");
    out.error = load_fixture("error");
    return out;
  }();
  return f;
}

// What IPython prints for an exception, coloured as in the captured traceback.
std::vector<std::string> default_traceback(const std::string& ename, const std::string& evalue) {
  return {
      "\x1b[0;31m" + std::string(75, '-') + "\x1b[0m",
      "\x1b[0;31m" + ename + "\x1b[0m                         Traceback (most recent call last)",
      "\x1b[0;31m" + ename + "\x1b[0m: " + evalue};
}

}  // namespace

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() >= deadline) {
      return pred();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// ---- FakeCell ---------------------------------------------------------------------------------

FakeCell& FakeCell::out(std::string text) {
  return iopub("stream", json{{"name", "stdout"}, {"text", std::move(text)}});
}

FakeCell& FakeCell::err(std::string text) {
  return iopub("stream", json{{"name", "stderr"}, {"text", std::move(text)}});
}

FakeCell& FakeCell::display(json data, json metadata) {
  json content = fixtures().display_data.content;
  content["data"] = std::move(data);
  content["metadata"] = std::move(metadata);
  return iopub("display_data", std::move(content));
}

FakeCell& FakeCell::result(json data) {
  json content = fixtures().execute_result.content;
  content["data"] = std::move(data);
  content["metadata"] = json::object();
  return iopub("execute_result", std::move(content));  // execution_count set when it runs
}

FakeCell& FakeCell::error(std::string ename, std::string evalue,
                          std::vector<std::string> traceback) {
  Step s;
  s.kind = Step::Kind::kError;
  if (traceback.empty()) {
    traceback = default_traceback(ename, evalue);
  }
  s.ename = std::move(ename);
  s.evalue = std::move(evalue);
  s.traceback = std::move(traceback);
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::iopub(std::string msg_type, json content) {
  Step s;
  s.kind = Step::Kind::kIopub;
  s.msg_type = std::move(msg_type);
  s.content = std::move(content);
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::input(std::string prompt, AfterInput then, bool password) {
  Step s;
  s.kind = Step::Kind::kInput;
  s.prompt = std::move(prompt);
  s.then = std::move(then);
  s.password = password;
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::sleep(std::chrono::milliseconds duration) {
  Step s;
  s.kind = Step::Kind::kSleep;
  s.duration = duration;
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::hang() {
  Step s;
  s.kind = Step::Kind::kHang;
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::hang_ignoring_interrupts() {
  Step s;
  s.kind = Step::Kind::kHangHard;
  steps.push_back(std::move(s));
  return *this;
}

FakeCell& FakeCell::die(std::string reason) {
  Step s;
  s.kind = Step::Kind::kDie;
  s.reason = std::move(reason);
  steps.push_back(std::move(s));
  return *this;
}

// ---- the wire: what other threads tell a connection's kernel ----------------------------------

// The part of a fake connection that other threads reach (FakeKernel's kill, exit, SIGINT; the
// client's wake()). The rest of the fake kernel runs on the client's I/O thread, inside the
// transport's calls.
class FakeWire {
 public:
  struct Event {
    enum class Kind { kInterrupt, kRelease, kDied };
    Kind kind = Kind::kInterrupt;
    std::string reason;  // kDied
  };

  void interrupt() { push(Event{Event::Kind::kInterrupt, ""}); }
  void release() { push(Event{Event::Kind::kRelease, ""}); }  // FakeKernel::release_cell
  void died(std::string reason) { push(Event{Event::Kind::kDied, std::move(reason)}); }
  void wake() {
    {
      MutexLock lock(mu_);
      woken_ = true;
    }
    cv_.notify_all();
  }

  // Until an event, a wake() or `deadline` (none: no deadline).
  void wait(std::optional<Clock::time_point> deadline) {
    UniqueLock lock(mu_);
    auto ready = [&]() CELLGATE_REQUIRES(mu_) { return woken_ || !events_.empty(); };
    if (deadline) {
      while (!ready() && cv_.wait_until(lock, *deadline) != std::cv_status::timeout) {
      }
    } else {
      while (!ready()) {
        cv_.wait(lock);
      }
    }
    woken_ = false;
  }

  std::deque<Event> take() {
    MutexLock lock(mu_);
    return std::exchange(events_, {});
  }

 private:
  void push(Event event) {
    {
      MutexLock lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_all();
  }

  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Event> events_ CELLGATE_GUARDED_BY(mu_);
  bool woken_ CELLGATE_GUARDED_BY(mu_) = false;
};

namespace {

// ---- the transport: the kernel (as ipykernel) behind the client's router
// -------------------------

// Every message to the kernel arrives as wire frames, signed by the router and verified here as a
// kernel does; every message from it is shaped as the captured ones, encoded, signed and handed
// to the router as frames, which it checks as it checks a real kernel's. Runs on the client's
// I/O thread.
class FakeTransport : public kernel::Transport {
 public:
  FakeTransport(std::shared_ptr<FakeKernel> kernel, std::shared_ptr<FakeWire> wire,
                protocol::Signer signer)
      : kernel_(std::move(kernel)),
        wire_(std::move(wire)),
        signer_(std::move(signer)),
        engine_(protocol::new_uuid()),
        kernel_session_(fixtures().status.header.value("username", "username")),
        alive_(kernel_->running()) {}

  bool send(Channel channel, std::vector<std::string> frames) override {
    kernel_receive(channel, protocol::decode(frames, signer_));
    return true;  // as a DEALER, which queues while its peer is away
  }

  bool ping() override {
    if (alive_ && kernel_->heartbeating()) {
      inbox_.push_back(Incoming{true, Channel::kHeartbeat, {}});
    }
    return true;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (!inbox_.empty() || !started_) {
      return true;
    }
    std::optional<Clock::time_point> deadline;
    if (timeout.count() >= 0) {
      deadline = Clock::now() + timeout;
    }
    if (cell_ && cell_->wait == Wait::kSleep) {
      deadline = deadline ? std::min(*deadline, cell_->until) : cell_->until;
    }
    wire_->wait(deadline);
    return true;
  }

  bool receive(kernel::TransportEvents& events) override {
    if (!started_) {
      started_ = true;
      if (!alive_) {
        events.on_peer_gone("the kernel is not running");
      }
    }
    deliver(events);  // what the kernel said before the events below
    for (auto& event : wire_->take()) {
      switch (event.kind) {
        case FakeWire::Event::Kind::kInterrupt:
          interrupt_cell();
          break;
        case FakeWire::Event::Kind::kRelease:
          release_cell();
          break;
        case FakeWire::Event::Kind::kDied:
          died(event.reason, events);
          break;
      }
    }
    if (cell_ && cell_->wait == Wait::kSleep && Clock::now() >= cell_->until) {
      cell_->wait = Wait::kNone;
      advance();
    }
    deliver(events);
    return true;
  }

  void wake() override { wire_->wake(); }

  std::string name() const override { return "fake kernel " + std::to_string(kernel_->pid()); }

 private:
  struct Incoming {
    bool pong = false;
    Channel channel = Channel::kShell;
    std::vector<std::string> frames;
  };

  enum class Wait { kNone, kHeld, kSleep, kInput, kHang, kHangHard };
  struct Cell {
    protocol::Message request;
    std::deque<FakeCell::Step> steps;
    Wait wait = Wait::kNone;
    Clock::time_point until;
    FakeCell::AfterInput then;
    int execution_count = 0;
    bool allow_stdin = false;
    bool silent = false;
  };

  void deliver(kernel::TransportEvents& events) {
    while (!inbox_.empty()) {
      Incoming in = std::move(inbox_.front());
      inbox_.pop_front();
      if (in.pong) {
        events.on_pong();
        continue;
      }
      std::vector<std::string_view> views(in.frames.begin(), in.frames.end());
      events.on_frames(in.channel, views, [] {});
    }
  }

  // A cell held after its busy (FakeKernel::hold_next_cell) goes on: its handler runs.
  void release_cell() {
    if (!cell_ || cell_->wait != Wait::kHeld) {
      return;
    }
    kernel_->set_cell_held(false);
    cell_->wait = Wait::kNone;
    begin_cell();
  }

  void died(const std::string& reason, kernel::TransportEvents& events) {
    cell_.reset();
    shell_queue_.clear();
    kernel_->set_cell_running(false);
    kernel_->set_cell_held(false);
    if (!alive_) {
      return;
    }
    alive_ = false;
    events.on_peer_gone(reason);
  }

  // ---- the kernel's side (as ipykernel) ----

  // A message from the kernel, shaped as the captured ones, encoded and signed as ipykernel does.
  void emit(Channel channel, const std::string& msg_type, json content,
            const protocol::Message& parent, json metadata = json::object()) {
    protocol::Message msg;
    msg.header = fixtures().status.header;
    msg.header["msg_id"] =
        kernel_session_.id() + "_" + std::to_string(kernel_->pid()) + "_" + std::to_string(++sent_);
    msg.header["msg_type"] = msg_type;
    msg.header["session"] = kernel_session_.id();
    msg.header["date"] = protocol::iso8601_now();
    msg.parent_header = parent.header;
    msg.metadata = std::move(metadata);
    msg.content = std::move(content);
    if (channel == Channel::kIopub) {
      msg.identities.push_back(msg_type == "stream"
                                   ? "stream." + msg.content.value("name", "stdout")
                                   : "kernel." + engine_ + "." + msg_type);
    }
    inbox_.push_back(Incoming{false, channel, protocol::encode(msg, signer_)});
  }

  void status(const std::string& state, const protocol::Message& parent) {
    emit(Channel::kIopub, "status", json{{"execution_state", state}}, parent);
  }

  void kernel_receive(Channel channel, Result<protocol::Message> decoded) {
    if (!decoded) {
      return;  // a kernel drops what fails its signature check
    }
    protocol::Message msg = std::move(decoded).value();
    const std::string type = msg.msg_type();
    kernel_->record_received(std::string(kernel::to_string(channel)) + ":" + type);
    if (!alive_ || kernel_->unresponsive()) {
      return;
    }
    switch (channel) {
      case Channel::kShell:
        shell_queue_.push_back(std::move(msg));
        pump_shell();
        return;
      case Channel::kControl:
        control(msg);
        return;
      case Channel::kStdin:
        if (type == "input_reply" && cell_ && cell_->wait == Wait::kInput) {
          answer_input(msg.content.value("value", ""));
        }
        return;
      default:
        return;
    }
  }

  void reply_simple(Channel channel, const protocol::Message& request) {
    std::string type = request.msg_type();
    const auto pos = type.rfind("_request");
    if (pos == std::string::npos) {
      return;  // ipykernel logs unknown message types and answers nothing
    }
    type = type.substr(0, pos) + "_reply";
    json content = {{"status", "ok"}};
    if (type == "kernel_info_reply") {
      content = fixtures().kernel_info_reply.content;
    } else if (type == "comm_info_reply") {
      content["comms"] = json::object();
    } else if (type == "shutdown_reply") {
      content["restart"] = request.content.value("restart", false);
    } else if (type == "is_complete_reply") {
      content = {{"status", "complete"}};
    }
    status("busy", request);
    emit(channel, type, std::move(content), request);
    status("idle", request);
  }

  void control(const protocol::Message& msg) {
    const std::string type = msg.msg_type();
    if (type == "interrupt_request") {
      kernel_->record_interrupt();
      reply_simple(Channel::kControl, msg);
      interrupt_cell();
    } else if (type == "shutdown_request") {
      reply_simple(Channel::kControl, msg);
      kernel_->exit(0);
    } else {
      reply_simple(Channel::kControl, msg);
    }
  }

  void pump_shell() {
    while (!cell_ && !shell_queue_.empty() && alive_) {
      protocol::Message msg = std::move(shell_queue_.front());
      shell_queue_.pop_front();
      if (msg.msg_type() == "execute_request") {
        start_cell(std::move(msg));
      } else {
        reply_simple(Channel::kShell, msg);
      }
    }
  }

  void start_cell(protocol::Message request) {
    const std::string code = request.content.value("code", "");
    const bool silent = request.content.value("silent", false);
    kernel_->record_executed(code);
    kernel_->set_cell_running(true);
    Cell cell;
    cell.allow_stdin = request.content.value("allow_stdin", false);
    cell.request = std::move(request);
    status("busy", cell.request);
    // ipykernel counts every cell that is not silent, and echoes it on execute_input.
    cell.execution_count = silent ? kernel_->execution_count() : kernel_->next_execution_count();
    cell.silent = silent;
    Responder responder = kernel_->responder();
    if (responder) {
      for (auto& step : responder(code).steps) {
        cell.steps.push_back(std::move(step));
      }
    }
    cell_ = std::move(cell);
    if (!silent && kernel_->take_hold()) {
      cell_->wait = Wait::kHeld;
      kernel_->set_cell_held(true);
      return;
    }
    begin_cell();
  }

  // The kernel's handler runs (ipykernel's SIGINT handler is in place from here on).
  void begin_cell() {
    if (!cell_->silent) {
      emit(Channel::kIopub, "execute_input",
           json{{"code", cell_->request.content.value("code", "")},
                {"execution_count", cell_->execution_count}},
           cell_->request);
    }
    advance();
  }

  // Runs steps until the cell waits or ends.
  void advance() {
    while (cell_ && cell_->wait == Wait::kNone) {
      if (cell_->steps.empty()) {
        finish({});
        return;
      }
      FakeCell::Step step = std::move(cell_->steps.front());
      cell_->steps.pop_front();
      switch (step.kind) {
        case FakeCell::Step::Kind::kIopub:
          if (step.msg_type == "execute_result") {
            step.content["execution_count"] = cell_->execution_count;
          }
          emit(Channel::kIopub, step.msg_type, std::move(step.content), cell_->request);
          break;
        case FakeCell::Step::Kind::kError:
          raise_error(step.ename, step.evalue, step.traceback);
          return;
        case FakeCell::Step::Kind::kInput:
          if (!cell_->allow_stdin) {
            const std::string evalue =
                "raw_input was called, but this frontend does not support input requests.";
            raise_error("StdinNotImplementedError", evalue,
                        default_traceback("StdinNotImplementedError", evalue));
            return;
          }
          cell_->wait = Wait::kInput;
          cell_->then = std::move(step.then);
          emit(Channel::kStdin, "input_request",
               json{{"prompt", step.prompt}, {"password", step.password}}, cell_->request);
          break;
        case FakeCell::Step::Kind::kSleep:
          cell_->wait = Wait::kSleep;
          cell_->until = Clock::now() + step.duration;
          break;
        case FakeCell::Step::Kind::kHang:
          cell_->wait = Wait::kHang;
          break;
        case FakeCell::Step::Kind::kHangHard:
          cell_->wait = Wait::kHangHard;
          break;
        case FakeCell::Step::Kind::kDie:
          cell_->wait = Wait::kHangHard;
          kernel_->kill(step.reason);
          break;
      }
    }
  }

  void answer_input(const std::string& value) {
    FakeCell rest;
    if (cell_->then) {
      cell_->then(value, rest);
    }
    cell_->then = nullptr;
    for (auto it = rest.steps.rbegin(); it != rest.steps.rend(); ++it) {
      cell_->steps.push_front(std::move(*it));
    }
    cell_->wait = Wait::kNone;
    advance();
  }

  void interrupt_cell() {
    if (!cell_ || cell_->wait == Wait::kHangHard || cell_->wait == Wait::kHeld) {
      return;
    }
    // Python raises KeyboardInterrupt wherever the cell is (IPython shows it as a traceback).
    raise_error("KeyboardInterrupt", "", default_traceback("KeyboardInterrupt", ""));
  }

  // error on iopub, execute_reply with status error; the cell ends.
  void raise_error(const std::string& ename, const std::string& evalue,
                   const std::vector<std::string>& traceback) {
    json content = fixtures().error.content;
    content["ename"] = ename;
    content["evalue"] = evalue;
    content["traceback"] = traceback;
    emit(Channel::kIopub, "error", content, cell_->request);
    finish(content);
  }

  // execute_reply (ok, or error with `error`'s fields), then status idle.
  void finish(const json& error) {
    Cell cell = std::move(*cell_);
    cell_.reset();
    const protocol::Message& shape =
        error.empty() ? fixtures().execute_reply : fixtures().execute_reply_error;
    json metadata = shape.metadata;
    metadata["started"] = protocol::iso8601_now();
    metadata["engine"] = engine_;
    json content = shape.content;
    content["execution_count"] = cell.execution_count;
    if (!error.empty()) {
      content["ename"] = error["ename"];
      content["evalue"] = error["evalue"];
      content["traceback"] = error["traceback"];
      content["engine_info"]["engine_uuid"] = engine_;
    }
    emit(Channel::kShell, "execute_reply", std::move(content), cell.request, std::move(metadata));
    status("idle", cell.request);
    kernel_->set_cell_running(false);
    pump_shell();
  }

  const std::shared_ptr<FakeKernel> kernel_;
  const std::shared_ptr<FakeWire> wire_;
  const protocol::Signer signer_;
  const std::string engine_;
  const protocol::Session kernel_session_;

  bool alive_;                  // the kernel runs (as far as this connection has heard)
  bool started_ = false;        // the first receive() has said whether it runs
  std::deque<Incoming> inbox_;  // from the kernel, to hand to the router
  std::deque<protocol::Message> shell_queue_;
  std::optional<Cell> cell_;
  std::uint64_t sent_ = 0;
};

}  // namespace

// ---- FakeKernel -------------------------------------------------------------------------------

FakeKernel::FakeKernel(pid_t pid, kernel::LaunchRequest request, Responder responder)
    : pid_(pid), request_(std::move(request)), responder_(std::move(responder)) {}

std::vector<int> FakeKernel::signals() const {
  std::lock_guard lock(mu_);
  return signals_;
}

std::vector<std::string> FakeKernel::received() const {
  std::lock_guard lock(mu_);
  return received_;
}

std::vector<std::string> FakeKernel::executed() const {
  std::lock_guard lock(mu_);
  return executed_;
}

int FakeKernel::interrupts() const {
  std::lock_guard lock(mu_);
  return interrupts_;
}

bool FakeKernel::cell_running() const {
  std::lock_guard lock(mu_);
  return cell_running_;
}

bool FakeKernel::running() const {
  std::lock_guard lock(mu_);
  return !exited_.has_value();
}

bool FakeKernel::heartbeating() const {
  std::lock_guard lock(mu_);
  return heartbeating_;
}

int FakeKernel::execution_count() const {
  std::lock_guard lock(mu_);
  return execution_count_;
}

void FakeKernel::end(launcher::StatusEvent event, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (!exited_) {
      event.kind = launcher::StatusEvent::Kind::kExited;
      event.pid = pid_;
      exited_ = std::move(event);
    }
    heartbeating_ = false;
    cell_running_ = false;
  }
  cv_.notify_all();
  if (auto c = connection()) {
    c->died(reason);
  }
}

void FakeKernel::kill(const std::string& reason) {
  launcher::StatusEvent ev;
  ev.reason = launcher::ExitReason::kSignaled;
  ev.signal = SIGKILL;
  ev.message = reason;
  end(std::move(ev), reason);
}

void FakeKernel::exit(int code) {
  launcher::StatusEvent ev;
  ev.reason = launcher::ExitReason::kOk;
  ev.exit_code = code;
  end(std::move(ev), "the kernel exited with code " + std::to_string(code));
}

void FakeKernel::stop_heartbeat() {
  std::lock_guard lock(mu_);
  heartbeating_ = false;  // the connection's pings go unanswered from now on
}

void FakeKernel::set_unresponsive(bool silent) {
  std::lock_guard lock(mu_);
  unresponsive_ = silent;
}

void FakeKernel::set_cpu_usage(std::chrono::microseconds used) {
  std::lock_guard lock(mu_);
  cpu_usage_ = used;
}

std::optional<std::chrono::microseconds> FakeKernel::cpu_usage() const {
  std::lock_guard lock(mu_);
  return cpu_usage_;
}

bool FakeKernel::unresponsive() const {
  std::lock_guard lock(mu_);
  return unresponsive_;
}

void FakeKernel::set_responder(Responder responder) {
  std::lock_guard lock(mu_);
  responder_ = std::move(responder);
}

Responder FakeKernel::responder() const {
  std::lock_guard lock(mu_);
  return responder_;
}

void FakeKernel::record_signal(int sig) {
  {
    std::lock_guard lock(mu_);
    signals_.push_back(sig);
    if (sig == SIGINT) {
      ++interrupts_;
    }
  }
  if (sig == SIGINT) {
    if (auto conn = connection()) {
      conn->interrupt();
    }
  } else if (sig == SIGKILL || sig == SIGTERM) {
    kill("killed by signal " + std::to_string(sig));
  }
}

void FakeKernel::hold_next_cell() {
  std::lock_guard lock(mu_);
  hold_next_ = true;
}

void FakeKernel::release_cell() {
  if (auto conn = connection()) {
    conn->release();
  }
}

bool FakeKernel::cell_held() const {
  std::lock_guard lock(mu_);
  return cell_held_;
}

bool FakeKernel::take_hold() {
  std::lock_guard lock(mu_);
  return std::exchange(hold_next_, false);
}

void FakeKernel::set_cell_held(bool held) {
  std::lock_guard lock(mu_);
  cell_held_ = held;
}

void FakeKernel::record_interrupt() {
  std::lock_guard lock(mu_);
  ++interrupts_;
}

void FakeKernel::record_received(const std::string& what) {
  std::lock_guard lock(mu_);
  received_.push_back(what);
}

void FakeKernel::record_executed(const std::string& code) {
  std::lock_guard lock(mu_);
  executed_.push_back(code);
}

void FakeKernel::set_cell_running(bool running) {
  std::lock_guard lock(mu_);
  cell_running_ = running;
}

int FakeKernel::next_execution_count() {
  std::lock_guard lock(mu_);
  return ++execution_count_;
}

std::optional<launcher::StatusEvent> FakeKernel::exit_event() const {
  std::lock_guard lock(mu_);
  return exited_;
}

std::optional<launcher::StatusEvent> FakeKernel::wait_exit(
    std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return exited_.has_value(); });
  return exited_;
}

void FakeKernel::attach(const std::shared_ptr<FakeWire>& connection) {
  std::lock_guard lock(mu_);
  connection_ = connection;
}

std::shared_ptr<FakeWire> FakeKernel::connection() const {
  std::lock_guard lock(mu_);
  return connection_.lock();
}

// ---- FakeProcess ------------------------------------------------------------------------------

FakeProcess::FakeProcess(std::shared_ptr<FakeKernel> kernel) : kernel_(std::move(kernel)) {
  const std::string prefix = "/nonexistent/fake-kernel-" + std::to_string(kernel_->pid());
  info_ = kernel::ConnectionInfo::make_ipc(prefix);
  info_.kernel_name = kernel_->request().spec.name;
  connection_file_ = prefix + ".json";
}

FakeProcess::~FakeProcess() {
  if (kernel_->running()) {
    kernel_->kill("the process handle was destroyed");
  }
}

std::string FakeProcess::log_tail(std::size_t max_bytes) const {
  std::string log = "fake kernel " + std::to_string(kernel_->pid()) + "\n";
  return log.size() > max_bytes ? log.substr(log.size() - max_bytes) : log;
}

Result<jail::CgroupStats> FakeProcess::cgroup_stats() const {
  auto used = kernel_->cpu_usage();
  if (!used) {
    return make_error(ErrorCode::kNotFound, "no_cgroup", "a fake kernel has no cgroup");
  }
  jail::CgroupStats stats;
  stats.cpu_usage_usec = static_cast<std::uint64_t>(used->count());
  stats.cpu_usage_known = true;
  return stats;
}

Result<void> FakeProcess::signal(int sig) {
  if (!kernel_->running()) {
    return make_error(ErrorCode::kUnavailable, "kernel_gone",
                      "kill(" + std::to_string(kernel_->pid()) + "): ESRCH (No such process)");
  }
  kernel_->record_signal(sig);
  return {};
}

std::optional<launcher::StatusEvent> FakeProcess::poll_exit() {
  return kernel_->exit_event();
}

std::optional<launcher::StatusEvent> FakeProcess::wait_exit(std::chrono::milliseconds timeout) {
  return kernel_->wait_exit(timeout);
}

// ---- FakeBackend ------------------------------------------------------------------------------

FakeBackend::FakeBackend(Responder responder) : responder_(std::move(responder)) {
  (void)fixtures();  // fail at once, not on a connection's thread, when they are missing
}

FakeBackend::~FakeBackend() = default;

void FakeBackend::start() {
  std::lock_guard lock(mu_);
  started_ = true;
}

void FakeBackend::tick() {
  std::lock_guard lock(mu_);
  ++ticks_;
}

bool FakeBackend::wait_fast(std::chrono::milliseconds) {
  std::lock_guard lock(mu_);
  return started_ && fast_;
}

Result<std::unique_ptr<kernel::KernelProcessHandle>> FakeBackend::launch(
    kernel::LaunchRequest request) {
  std::chrono::milliseconds delay{0};
  {
    std::lock_guard lock(mu_);
    ++launches_;
    most_launching_ = std::max(most_launching_, ++launching_);
    delay = launch_delay_;
  }
  if (delay.count() > 0) {
    std::this_thread::sleep_for(delay);
  }
  std::shared_ptr<FakeKernel> k;
  {
    std::lock_guard lock(mu_);
    --launching_;
    if (fail_count_ > 0) {
      --fail_count_;
      return make_error(ErrorCode::kInternal, "kernel_start_failed", fail_message_);
    }
    k = std::make_shared<FakeKernel>(next_pid_++, std::move(request), responder_);
    k->set_unresponsive(next_unresponsive_);
    kernels_.push_back(k);
  }
  return std::unique_ptr<kernel::KernelProcessHandle>(std::make_unique<FakeProcess>(k));
}

Result<std::unique_ptr<kernel::KernelConnection>> FakeBackend::connect(
    const kernel::KernelProcessHandle& process, kernel::ClientOptions options) {
  const auto* fake = dynamic_cast<const FakeProcess*>(&process);
  if (fake == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "not_fake",
                      "FakeBackend can only connect to its own FakeProcesses");
  }
  {
    std::lock_guard lock(mu_);
    ++connects_;
  }
  const kernel::ConnectionInfo& info = process.connection();
  CELLGATE_ASSIGN_OR_RETURN(protocol::Signer kernel_signer,
                            protocol::Signer::create(info.signature_scheme, info.key));
  CELLGATE_ASSIGN_OR_RETURN(protocol::Signer client_signer,
                            protocol::Signer::create(info.signature_scheme, info.key));
  auto wire = std::make_shared<FakeWire>();
  fake->kernel()->attach(wire);
  // The client that ships, over a transport whose far end is the fake kernel.
  CELLGATE_ASSIGN_OR_RETURN(
      auto client, kernel::KernelClient::open(std::make_unique<FakeTransport>(
                                                  fake->kernel(), wire, std::move(kernel_signer)),
                                              std::move(client_signer), std::move(options)));
  return std::unique_ptr<kernel::KernelConnection>(std::move(client));
}

void FakeBackend::fail_next_launch(std::string message, int count) {
  std::lock_guard lock(mu_);
  fail_message_ = std::move(message);
  fail_count_ = count;
}

void FakeBackend::set_launch_delay(std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  launch_delay_ = delay;
}

void FakeBackend::set_next_unresponsive(bool silent) {
  std::lock_guard lock(mu_);
  next_unresponsive_ = silent;
}

void FakeBackend::set_fast(bool fast) {
  std::lock_guard lock(mu_);
  fast_ = fast;
}

void FakeBackend::set_responder(Responder responder) {
  std::vector<std::shared_ptr<FakeKernel>> kernels;
  {
    std::lock_guard lock(mu_);
    responder_ = responder;
    kernels = kernels_;
  }
  for (const auto& k : kernels) {
    k->set_responder(responder);
  }
}

int FakeBackend::launches() const {
  std::lock_guard lock(mu_);
  return launches_;
}

int FakeBackend::most_concurrent_launches() const {
  std::lock_guard lock(mu_);
  return most_launching_;
}

void FakeBackend::reset_most_concurrent_launches() {
  std::lock_guard lock(mu_);
  most_launching_ = launching_;
}

int FakeBackend::connects() const {
  std::lock_guard lock(mu_);
  return connects_;
}

int FakeBackend::ticks() const {
  std::lock_guard lock(mu_);
  return ticks_;
}

bool FakeBackend::started() const {
  std::lock_guard lock(mu_);
  return started_;
}

std::vector<std::shared_ptr<FakeKernel>> FakeBackend::kernels() const {
  std::lock_guard lock(mu_);
  return kernels_;
}

std::shared_ptr<FakeKernel> FakeBackend::kernel(std::size_t index) const {
  std::lock_guard lock(mu_);
  return index < kernels_.size() ? kernels_[index] : nullptr;
}

std::shared_ptr<FakeKernel> FakeBackend::find(pid_t pid) const {
  std::lock_guard lock(mu_);
  for (const auto& k : kernels_) {
    if (k->pid() == pid) {
      return k;
    }
  }
  return nullptr;
}

bool FakeBackend::kill(pid_t pid, const std::string& reason) {
  auto k = find(pid);
  if (!k) {
    return false;
  }
  k->kill(reason);
  return true;
}

}  // namespace cellgate::testing
