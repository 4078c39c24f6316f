#include "cellgate/http/stats.hpp"

#include <spdlog/spdlog.h>

#include <string>

namespace cellgate::http {

std::string method_label(const Request& req) {
  switch (req.method()) {
    case Verb::get:
    case Verb::head:
    case Verb::post:
    case Verb::put:
    case Verb::patch:
    case Verb::delete_:
    case Verb::options:
      return std::string(req.method_string());
    default:
      return "other";
  }
}

TimedExchange::TimedExchange(std::shared_ptr<HttpStats> stats, std::string method,
                             std::shared_ptr<Exchange> inner)
    : stats_(std::move(stats)), method_(std::move(method)), inner_(std::move(inner)) {}

TimedExchange::~TimedExchange() {
  if (code_ != 0) {
    observe();  // begun, never ended: the client left mid-stream
  }
}

void TimedExchange::set_path(std::string_view path) {
  constexpr std::size_t kMax = 256;
  path_.clear();
  for (std::size_t i = 0; i < path.size() && i < kMax; ++i) {
    const char c = path[i];
    path_ += (c > 0x20 && c < 0x7f) ? c : '?';
  }
  if (path.size() > kMax) {
    path_ += "...";
  }
}

void TimedExchange::reply(Response res) {
  code_ = res.result_int();
  inner_->reply(std::move(res));
  observe();
}

void TimedExchange::begin(Response head) {
  code_ = head.result_int();
  inner_->begin(std::move(head));
}

void TimedExchange::end() {
  inner_->end();
  observe();
}

void TimedExchange::observe() {
  if (observed_ || !stats_) {
    return;
  }
  observed_ = true;
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
  stats_->requests.observe({method_, route_, std::to_string(code_)}, took.count());
  const auto level = code_ < 300 || code_ == 304 ? spdlog::level::debug
                     : code_ < 400               ? spdlog::level::info
                     : code_ < 500               ? spdlog::level::warn
                                                 : spdlog::level::err;
  if (spdlog::should_log(level)) {
    spdlog::log(level, "{} {} {} ({}) {:.2f}ms", code_, method_, path_, inner_->peer(),
                took.count() * 1000);
  }
}

}  // namespace cellgate::http
