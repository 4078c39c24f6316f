#include "cell.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"

namespace cellgate::execute {
namespace {

using nlohmann::json;
using Clock = util::Clock;
using kernel::Channel;
using kernel::RequestEnd;
namespace files = store::files;

constexpr std::size_t kSnapshotEntries = 10000;  // work-dir entries compared before and after
constexpr auto kTeardownTime = std::chrono::seconds(2);  // past the deadline, for teardown code
constexpr double kMaxTimeoutSeconds = 365.0 * 24 * 3600;
// Kernel messages on their way to one cell's strand before the kernel's I/O thread waits (one
// message of any size always goes through), and the longest it waits for one.
constexpr std::size_t kInboxBytes = 8u << 20;
constexpr auto kInboxMaxWait = std::chrono::seconds(1);

long long to_ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

Clock::duration timeout_of(double s) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(s, 0.0, kMaxTimeoutSeconds)));
}

json silent_content(const std::string& code) {
  json content = kernel::execute_content(code, /*allow_stdin=*/false, /*store_history=*/false,
                                         /*silent=*/true);
  content["stop_on_error"] = false;
  return content;
}

std::string reply_status(const json& reply) {
  auto it = reply.find("status");
  return it != reply.end() && it->is_string() ? it->get<std::string>() : "error";
}

std::string reply_evalue(const std::optional<json>& reply) {
  if (!reply) {
    return "no reply";
  }
  auto it = reply->find("evalue");
  return it != reply->end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Files the kernel's own machinery keeps in its home (IPython's history, matplotlib's font
// cache, fontconfig): not what a cell made, so not reported as its files.
bool is_housekeeping(const std::string& path) {
  for (const char* prefix : {".ipython/", ".cache/", ".config/", ".local/", ".jupyter/"}) {
    if (path.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return false;
}

std::optional<files::Snapshot> snapshot_work_dir(const kernels::ManagedKernel& kernel) {
  auto dir = files::WorkDir::open(kernel.work_dir(), kernel.files_uid(), kernel.files_uid());
  if (!dir) {
    return std::nullopt;
  }
  auto snap = dir->snapshot(kSnapshotEntries);
  if (!snap || snap->truncated) {
    return std::nullopt;  // a partial walk would report what it missed as created or deleted
  }
  return std::move(snap).value();
}

}  // namespace

// ---- making and driving a cell ----------------------------------------------------------------

Cell::Cell(const std::shared_ptr<CellContext>& context, std::shared_ptr<util::Strand> strand,
           CellParams params, Done done)
    : context_(context),
      strand_(std::move(strand)),
      params_(std::move(params)),
      done_(std::move(done)),
      collector_(context->limits, params_.silent ? nullptr : params_.options.on_event,
                 &context->artifacts, params_.kernel_id),
      inbox_(std::make_shared<Inbox>(kInboxBytes, kInboxMaxWait)),
      stdin_lines_(params_.request.stdin_lines.begin(), params_.request.stdin_lines.end()) {}

Cell::~Cell() {
  inbox_->close();  // a kernel's I/O thread never waits for a cell that is gone
}

std::shared_ptr<Cell> Cell::launch(const std::shared_ptr<CellContext>& context,
                                   std::shared_ptr<util::Strand> strand, CellParams params,
                                   Done done) {
  auto cell =
      std::make_shared<Cell>(context, std::move(strand), std::move(params), std::move(done));
  {
    MutexLock lock(context->mu);
    if (context->closed) {
      return nullptr;
    }
    context->live[cell.get()] = cell;
  }
  cell->strand_->post([cell] { cell->begin(); });
  return cell;
}

void Cell::cancel() {
  strand_->post([weak = weak_from_this()] {
    if (auto cell = weak.lock()) {
      cell->on_cancel();
    }
  });
}

void Cell::abandon() {
  inbox_->close();
  strand_->post([cell = shared_from_this()] { cell->on_abandon(); });
}

std::shared_ptr<util::Timer> Cell::at(Clock::time_point when, void (Cell::*fn)()) {
  return strand_->at(when, [weak = weak_from_this(), fn] {
    if (auto cell = weak.lock()) {
      (cell.get()->*fn)();
    }
  });
}

std::shared_ptr<kernels::ManagedKernel> Cell::kernel() const {
  return kernel_.lock();
}

void Cell::begin() {
  started_ = context_->loop.now();
  deadline_ = started_ + timeout_of(params_.request.timeout_seconds);
  auto found = context_->registry.find(params_.kernel_id);
  if (!found) {
    complete(std::move(found).error());
    return;
  }
  kernel_ = *found;
  deadline_timer_ = at(deadline_, &Cell::on_deadline);
  if (params_.options.keepalive.count() > 0) {
    keepalive_timer_ = at(started_ + params_.options.keepalive, &Cell::on_keepalive);
  }
  ticket_ = context_->queues.enter(params_.kernel_id, [weak = weak_from_this(), strand = strand_] {
    strand->post([weak] {
      if (auto cell = weak.lock()) {
        cell->on_turn();
      }
    });
  });
}

void Cell::on_turn() {
  if (state_ != State::kQueued) {
    return;  // it ended while its turn was on the way (and passed the turn on then)
  }
  auto found = context_->registry.find(params_.kernel_id);
  if (!found) {
    finish_unrun("dead", "the kernel was shut down before the cell started; it did not run",
                 /*state_lost=*/true);
    return;
  }
  const auto& k = *found;
  kernel_ = k;
  auto conn = k->connection();
  if (!conn && k->state() == kernels::KernelState::kHibernated && !resume_tried_) {
    // Hibernated: resumed first (registry.resume blocks: on the offload pool), whoever sent the
    // cell (agent API, MCP, E2B, the CLI); the turn is kept meanwhile and the deadline runs.
    resume_tried_ = true;
    context_->offload([cell = shared_from_this()] {
      auto resumed = cell->context_->registry.resume(cell->params_.kernel_id);
      cell->strand_->post([cell, resumed = std::move(resumed)] {
        if (cell->state_ != State::kQueued) {
          return;  // its deadline or a cancel ended it meanwhile
        }
        if (!resumed) {
          cell->complete(resumed.error());
          return;
        }
        cell->on_turn();
      });
    });
    return;
  }
  if (!conn) {
    complete(make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                        "kernel " + params_.kernel_id + " is " + k->model().execution_state));
    return;
  }
  connection_ = conn;
  ran_ = true;
  if (!params_.silent) {
    if (auto s = k->cgroup_stats()) {
      before_stats_ = *s;
    }
    before_files_ = snapshot_work_dir(*k);
  }
  if (!params_.request.setup_code.empty()) {
    send_setup();
  } else {
    send_cell();
  }
}

std::uint64_t Cell::send_execute(json content, bool wait_for_idle) {
  auto conn = connection();
  if (!conn) {
    return 0;
  }
  const std::uint64_t id = ++next_request_;
  // Called on the connection's I/O thread: only post (waiting while the strand is far behind),
  // so parsing, artifacts and file I/O run on the strand. The cell is held weakly: a cell that is
  // done and gone drops what comes late.
  kernel::RequestHandlers handlers;
  handlers.on_envelope = [weak = weak_from_this(), strand = strand_, inbox = inbox_,
                          id](const protocol::EnvelopePtr& envelope) {
    const std::size_t bytes = envelope->size();
    if (!inbox->admit(bytes)) {
      return;  // the cell is done
    }
    strand->post([weak, inbox, id, envelope, bytes] {
      if (auto cell = weak.lock()) {
        cell->on_envelope(id, envelope);
      }
      inbox->release(bytes);
    });
  };
  handlers.on_end = [weak = weak_from_this(), strand = strand_, id](RequestEnd end) {
    strand->post([weak, id, end] {
      if (auto cell = weak.lock()) {
        cell->on_request_end(id, end);
      }
    });
  };
  handlers.wait_for_idle = wait_for_idle;
  conn->send(Channel::kShell, "execute_request", std::move(content), std::move(handlers));
  return id;
}

void Cell::send_setup() {
  state_ = State::kSetup;
  setup_request_ = in_flight_ = send_execute(silent_content(params_.request.setup_code), false);
  if (in_flight_ == 0) {
    end_ = RequestEnd::kCancelled;
    after_cell();
  }
}

void Cell::send_cell() {
  state_ = State::kRunning;
  json content;
  if (params_.silent) {
    content = silent_content(params_.request.code);
  } else {
    content = kernel::execute_content(params_.request.code, !params_.request.stdin_lines.empty(),
                                      params_.request.store_history);
    content["stop_on_error"] = false;  // one agent call must not abort the next one
  }
  cell_request_ = in_flight_ = send_execute(std::move(content), !params_.silent);
  if (in_flight_ == 0) {
    end_ = RequestEnd::kCancelled;
    after_cell();
  }
}

void Cell::on_envelope(std::uint64_t request, const protocol::EnvelopePtr& envelope) {
  if (state_ == State::kDone || !envelope) {
    return;
  }
  const std::string& type = envelope->header().msg_type;
  const Channel channel = envelope->channel();
  try {
    if (request == setup_request_) {
      if (channel == Channel::kShell && type == "execute_reply") {
        setup_reply_ = envelope->message().content;
      }
      return;
    }
    if (request != cell_request_) {
      return;  // teardown: nothing of it is kept
    }
    // ipykernel publishes `status: busy` before it installs its SIGINT handler (the kernel
    // ignores SIGINT between cells) and `execute_input` after: a cell has begun once a message
    // of the handler's own came. A silent cell publishes none, so its busy has to do.
    if (channel == Channel::kIopub && !kernel_began_ && (type != "status" || params_.silent)) {
      kernel_began_ = true;
      if (interrupt_deferred_ && state_ == State::kStopping) {
        interrupt_deferred_ = false;
        interrupt();
        start_grace();
      }
    }
    if (channel == Channel::kShell && type == "execute_reply") {
      reply_ = envelope->message().content;
    } else if (channel == Channel::kStdin && type == "input_request") {
      std::string line;
      if (!stdin_lines_.empty()) {
        line = std::move(stdin_lines_.front());
        stdin_lines_.pop_front();
      }
      if (auto conn = connection()) {
        conn->send_input(envelope->message(), std::move(line));
      }
    } else if (channel == Channel::kIopub && !params_.silent && Collector::captures(type)) {
      // Streams, the flood a cell can make, are read from the frame without a DOM.
      if (type != "stream" || !collector_.on_stream_frame(envelope->frames().content)) {
        collector_.on_message(type, envelope->message().content);
      }
    }
  } catch (const std::exception& e) {
    // A kernel's message is not trusted to have the shape the spec gives it.
    spdlog::warn("kernel {}: a {} message of a cell was dropped: {}", params_.kernel_id, type,
                 e.what());
  }
}

void Cell::on_request_end(std::uint64_t request, RequestEnd end) {
  if (state_ == State::kDone) {
    return;
  }
  if (request == teardown_request_) {
    if (state_ == State::kTeardown) {
      finish();
    }
    return;
  }
  if (request != in_flight_) {
    return;
  }
  in_flight_ = 0;
  if (state_ == State::kRestarting) {
    return;  // the restart ended it; the restart's result decides
  }
  if (request == setup_request_ && end == RequestEnd::kComplete && state_ == State::kSetup) {
    if (!setup_reply_ || reply_status(*setup_reply_) != "ok") {
      complete(make_error(ErrorCode::kInternal, "setup_failed",
                          "setting up the cell failed: " + reply_evalue(setup_reply_)));
      return;
    }
    send_cell();
    return;
  }
  // The cell's request ended, or the setup's ended without a reply or after an interrupt: the
  // cell is not sent.
  end_ = end;
  after_cell();
}

void Cell::after_cell() {
  if (grace_timer_) {
    grace_timer_->cancel();
  }
  const bool teardown = !params_.silent && !params_.request.teardown_code.empty() && !state_lost_ &&
                        end_ == RequestEnd::kComplete;
  if (teardown) {
    state_ = State::kTeardown;
    teardown_request_ = send_execute(silent_content(params_.request.teardown_code), false);
    if (teardown_request_ != 0) {
      teardown_timer_ =
          at(std::max(deadline_, context_->loop.now()) + kTeardownTime, &Cell::on_teardown_timeout);
      return;
    }
  }
  finish();
}

void Cell::on_teardown_timeout() {
  if (state_ == State::kTeardown) {
    spdlog::warn("kernel {}: the teardown code of a cell did not finish in time",
                 params_.kernel_id);
    finish();
  }
}

// ---- deadline, cancel, interrupt, grace, restart ----------------------------------------------

void Cell::on_deadline() {
  switch (state_) {
    case State::kQueued:
      finish_unrun("timeout",
                   "the kernel was busy with another agent call for the whole timeout; the cell "
                   "did not run",
                   false);
      return;
    case State::kSetup:
    case State::kRunning:
      timed_out_ = true;
      stop();
      return;
    default:
      return;  // already stopping or ending
  }
}

void Cell::on_cancel() {
  switch (state_) {
    case State::kQueued:
      cancelled_ = true;
      finish_unrun("aborted", "the client left before the cell started; it did not run", false);
      return;
    case State::kSetup:
    case State::kRunning:
      cancelled_ = true;
      stop();
      return;
    default:
      return;  // stopping already (a timeout), restarting, tearing down, or done
  }
}

void Cell::on_abandon() {
  if (state_ == State::kDone) {
    return;
  }
  abandoned_ = true;
  if (state_ == State::kQueued) {
    finish_unrun("aborted", "the gateway is shutting down; the cell did not run", false);
    return;
  }
  if (state_ == State::kSetup || state_ == State::kRunning) {
    interrupt();
  }
  finish();
}

void Cell::on_keepalive() {
  if (state_ == State::kDone) {
    return;
  }
  collector_.emit(json{{"type", "keepalive"}});
  keepalive_timer_ = at(context_->loop.now() + params_.options.keepalive, &Cell::on_keepalive);
}

void Cell::stop() {
  // A cell whose request the kernel has not begun (it is still busy with what came before, slow
  // to read it, or between its busy and its SIGINT handler) is interrupted once it begins; the
  // grace timer bounds a kernel that never does.
  const bool now = state_ != State::kRunning || kernel_began_;
  state_ = State::kStopping;
  if (now) {
    interrupt();
  } else {
    interrupt_deferred_ = true;
  }
  start_grace();
}

void Cell::start_grace() {
  if (grace_timer_) {
    grace_timer_->cancel();
  }
  grace_cpu_usec_ = kernel_cpu_usec();
  grace_timer_ = at(context_->loop.now() + context_->limits.grace, &Cell::on_grace);
}

std::optional<std::uint64_t> Cell::kernel_cpu_usec() const {
  auto k = kernel();
  if (!k) {
    return std::nullopt;
  }
  auto stats = k->cgroup_stats();
  if (!stats || !stats->cpu_usage_known) {
    return std::nullopt;
  }
  return stats->cpu_usage_usec;
}

void Cell::interrupt() {
  auto k = kernel();
  if (k && k->spec().interrupt_mode == "message") {
    // The registry would wait for the interrupt_reply; the cell hears how it went from its own
    // request instead.
    if (auto conn = connection()) {
      kernel::RequestHandlers handlers;
      handlers.on_end = [](RequestEnd) {};
      handlers.wait_for_idle = false;
      conn->send(Channel::kControl, "interrupt_request", json::object(), std::move(handlers));
    }
    return;
  }
  if (auto interrupted = context_->registry.interrupt(params_.kernel_id); !interrupted) {
    spdlog::warn("kernel {}: cannot interrupt the cell: {}", params_.kernel_id,
                 interrupted.error().describe());
  }
}

void Cell::on_grace() {
  if (state_ != State::kStopping) {
    return;
  }
  // A kernel that used at least a tenth of the period's wall time on CPU is working, maybe on
  // the interrupt itself (the KeyboardInterrupt's traceback: IPython's first one took 5 s of
  // wall time on an emulated guest with --cpus 0.5); one stuck in C code that ignores SIGINT
  // works too, so the extensions are bounded. A kernel asleep in such code is restarted at once.
  const auto grace_usec = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(context_->limits.grace).count());
  if (const auto now = kernel_cpu_usec(); now && grace_cpu_usec_ && *now >= *grace_cpu_usec_ &&
                                          *now - *grace_cpu_usec_ >= grace_usec / 10 &&
                                          grace_extensions_ < kGraceExtensions) {
    ++grace_extensions_;
    spdlog::info(
        "kernel {}: still working {} ms after its cell's interrupt ({} ms of CPU in the last {} "
        "ms): another grace period ({} of {})",
        params_.kernel_id, grace_extensions_ * context_->limits.grace.count(),
        (*now - *grace_cpu_usec_) / 1000, context_->limits.grace.count(), grace_extensions_,
        kGraceExtensions);
    start_grace();
    return;
  }
  if (interrupt_deferred_) {
    // The interrupt still waits for the kernel to begin the cell (execute_input): never sent.
    spdlog::warn(
        "kernel {}: a timed-out cell was not begun by the kernel (no execute_input) {} ms after "
        "its timeout, so it could not be interrupted; restarting it",
        params_.kernel_id, context_->limits.grace.count());
  } else {
    spdlog::warn("kernel {}: a cell did not stop {} ms after its interrupt; restarting it",
                 params_.kernel_id, (grace_extensions_ + 1) * context_->limits.grace.count());
  }
  state_ = State::kRestarting;
  state_lost_ = true;
  // registry.restart blocks (stop, launch, kernel_info): on the offload pool, then back here.
  context_->offload([cell = shared_from_this()] {
    auto restarted = cell->context_->registry.restart(cell->params_.kernel_id);
    cell->strand_->post(
        [cell, restarted = std::move(restarted)] { cell->on_restarted(restarted); });
  });
}

void Cell::on_restarted(const Result<kernels::KernelModel>& restarted) {
  if (state_ != State::kRestarting) {
    return;
  }
  if (!restarted) {
    spdlog::warn("kernel {}: restarting it after a cell that did not stop failed: {}",
                 params_.kernel_id, restarted.error().describe());
  }
  finish();
}

// ---- the answer -------------------------------------------------------------------------------

void Cell::finish_unrun(const char* status, std::string message, bool state_lost) {
  if (params_.silent) {
    complete(make_error(std::string_view(status) == "timeout" ? ErrorCode::kDeadlineExceeded
                                                              : ErrorCode::kUnavailable,
                        status, message));
    return;
  }
  state_lost_ = state_lost;
  complete(answer_of(status, message, /*ran=*/false));
}

void Cell::finish() {
  if (state_ == State::kDone) {
    return;
  }
  if (params_.silent) {
    finish_silent();
    return;
  }
  std::string status;
  std::string message;
  if (abandoned_) {
    status = "aborted";
    message = "the gateway is shutting down; the cell was interrupted";
  } else if (timed_out_) {
    status = "timeout";
    message = state_lost_ ? "the cell ran past its timeout and did not stop when interrupted: the "
                            "kernel was restarted and its state is lost"
                          : "the cell ran past its timeout and was interrupted; the kernel's "
                            "state is kept";
  } else if (cancelled_) {
    // Stopped because the client left (a cancel after the cell ended changes nothing), whether
    // or not the interrupt produced a reply: a KeyboardInterrupt is not the cell's own error.
    status = "aborted";
    message = state_lost_ ? "the client left; the cell did not stop when interrupted, so the "
                            "kernel was restarted and its state is lost"
                          : "the client left; the cell was interrupted";
  } else if (end_ == RequestEnd::kKernelDead || !reply_) {
    status = "dead";
    state_lost_ = true;
    message = "the kernel died while running the cell";
  } else {
    status = reply_status(*reply_);
  }
  complete(answer_of(status, message, ran_));
}

void Cell::finish_silent() {
  if (timed_out_) {
    complete(make_error(ErrorCode::kDeadlineExceeded, "timeout",
                        std::string("the code ran past its timeout and was interrupted") +
                            (state_lost_ ? "; the kernel was restarted" : "")));
  } else if (cancelled_ || abandoned_) {
    complete(make_error(ErrorCode::kUnavailable, "aborted", "the code was interrupted"));
  } else if (!reply_ || reply_status(*reply_) != "ok") {
    complete(make_error(ErrorCode::kInternal, "setup_failed",
                        "setting up the cell failed: " + reply_evalue(reply_)));
  } else {
    complete(CellResult{});  // never rendered: run_silently answers Result<void>
  }
}

CellResult Cell::answer_of(const std::string& status, const std::string& message, bool ran) {
  CellResult answer;
  answer.status = cell_status_of(status);
  if (answer.status == CellStatus::kOther) {
    answer.other_status = status;
  }
  answer.metrics.wall_ms = to_ms(context_->loop.now() - started_);
  auto k = ran ? kernel() : nullptr;
  if (k) {
    if (auto after = k->cgroup_stats()) {
      if (before_stats_ && !state_lost_ && before_stats_->cpu_usage_known &&
          after->cpu_usage_known && after->cpu_usage_usec >= before_stats_->cpu_usage_usec) {
        answer.metrics.cpu_ms = (after->cpu_usage_usec - before_stats_->cpu_usage_usec) / 1000;
      }
      answer.metrics.memory_peak_bytes = after->memory_peak_bytes;
      answer.metrics.memory_current_bytes = after->memory_current_bytes;
    }
    if (before_files_) {
      if (auto after = snapshot_work_dir(*k)) {
        for (auto& change : files::diff(*before_files_, *after)) {
          if (change.type == files::FileType::kDirectory || is_housekeeping(change.path)) {
            continue;
          }
          if (change.kind != files::ChangeKind::kDeleted && change.type == files::FileType::kFile) {
            (void)context_->artifacts.record_file(params_.kernel_id, collector_.execution_count(),
                                                  change.path, change.size);
          }
          answer.files.push_back(std::move(change));
        }
      }
    }
  }

  if (reply_) {
    // A kernel's count of any other type reads as unknown.
    if (auto count = reply_->find("execution_count");
        count != reply_->end() && count->is_number_integer()) {
      answer.execution_count = count->get<std::int64_t>();
    }
  }
  answer.state_lost = state_lost_;
  collector_.fields(answer);
  // An error only the execute_reply names (IPython's UsageError for an unknown %magic goes to
  // stderr, with no iopub error message): named from the reply, as nbclient's
  // CellExecutionError does.
  if (answer.status == CellStatus::kError && !answer.error && reply_) {
    if (auto ename = reply_->find("ename"); ename != reply_->end() && ename->is_string()) {
      answer.error = CellError{ename->get<std::string>(), reply_evalue(reply_), {}, 0};
    }
  }
  answer.message = message;

  const auto& request = params_.request;
  const json optional_metric = answer.metrics.cpu_ms ? json(*answer.metrics.cpu_ms) : json();
  json audit = {
      {"time", protocol::iso8601(std::chrono::system_clock::now())},
      {"kernel", params_.kernel_id},
      {"client", params_.options.client},
      {"code_sha256", store::sha256_hex(request.code)},
      {"code_bytes", request.code.size()},
      {"limits",
       {{"timeout_s", request.timeout_seconds},
        {"stream_bytes", context_->limits.stream_bytes},
        {"output_bytes", context_->limits.output_bytes}}},
      {"status", status},
      {"state_lost", state_lost_},
      {"duration_ms", answer.metrics.wall_ms},
      {"cpu_ms", optional_metric},
      {"memory_peak_bytes",
       answer.metrics.memory_peak_bytes ? json(*answer.metrics.memory_peak_bytes) : json()},
      {"output_bytes",
       {{"stdout", collector_.stdout_bytes()},
        {"stderr", collector_.stderr_bytes()},
        {"dropped", collector_.dropped_bytes()}}},
      {"artifacts", collector_.artifacts().size()},
      {"files_changed", answer.files.size()}};
  if (const auto& error = collector_.error()) {
    audit["error"] = error->ename;
  }
  context_->audit.write(std::move(audit));
  context_->stats.by_status.add(status);
  context_->stats.duration_seconds.observe(static_cast<double>(answer.metrics.wall_ms) / 1000.0);
  context_->stats.dropped_output_bytes.add(collector_.dropped_bytes());
  return answer;
}

void Cell::complete(Answer answer) {
  if (state_ == State::kDone) {
    return;
  }
  auto self = shared_from_this();  // the live set may hold the last reference
  state_ = State::kDone;
  collector_.close();  // on_event is never called after done
  inbox_->close();     // late kernel messages are dropped on the I/O thread
  for (auto* timer : {&deadline_timer_, &keepalive_timer_, &grace_timer_, &teardown_timer_}) {
    if (*timer) {
      (*timer)->cancel();
      timer->reset();
    }
  }
  if (ticket_) {
    context_->queues.leave(params_.kernel_id, *ticket_);
    ticket_.reset();
  }
  {
    MutexLock lock(context_->mu);
    context_->live.erase(this);
  }
  if (auto done = std::exchange(done_, nullptr)) {
    done(std::move(answer));
  }
}

}  // namespace cellgate::execute
