// /metrics' parts: route patterns as labels (never the path), requests timed by method, route
// and code through TimedExchange, HistogramVec's series and cap, and the text it renders.
#include "cellgate/util/metrics.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "cellgate/http/router.hpp"
#include "cellgate/http/stats.hpp"

namespace cellgate::http {
namespace {

TEST(Metrics, PatternOfNamesTheRouteNotThePath) {
  Router r;
  r.add(Verb::get, "/api/kernels/{id}", [](Call&) {});
  r.add(Verb::get, "/api/kernels/{id}/channels", [](Call&) {});
  r.add(Verb::put, "/api/kernels/{id}/files/{path*}", [](Call&) {});
  EXPECT_EQ(r.pattern_of("/api/kernels/abc"), "/api/kernels/{id}");
  EXPECT_EQ(r.pattern_of("/api/kernels/abc/channels"), "/api/kernels/{id}/channels");
  EXPECT_EQ(r.pattern_of("/api/kernels/abc/files/a/b/c"), "/api/kernels/{id}/files/{path*}");
  EXPECT_EQ(r.pattern_of("/api/kernels/abc/nothing"), "");
  EXPECT_EQ(r.pattern_of("/no/such/route"), "");
}

TEST(Metrics, TimedExchangeObservesMethodRouteAndCode) {
  auto stats = std::make_shared<HttpStats>();
  Response answered;
  auto inner = std::make_shared<LambdaExchange>([&](Response res) { answered = std::move(res); });
  {
    auto timed = std::make_shared<TimedExchange>(stats, "GET", inner);
    timed->set_route("/api/kernels/{id}");
    Request req{Verb::get, "/api/kernels/abc", 11};
    timed->reply(json_response(req, Status::not_found, {{"x", 1}}));
  }
  {
    auto streamed = std::make_shared<TimedExchange>(stats, "POST", inner);  // no route set
    Request req{Verb::post, "/x", 11};
    streamed->begin(json_response(req, Status::ok, {}));
    streamed->write("a");
    // Never ended: the client left; observed when the exchange goes.
  }
  EXPECT_EQ(answered.result(), Status::not_found);
  const auto series = stats->requests.snapshot();
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[0].first, (std::vector<std::string>{"GET", "/api/kernels/{id}", "404"}));
  EXPECT_EQ(series[0].second.count, 1u);
  EXPECT_EQ(series[1].first, (std::vector<std::string>{"POST", "other", "200"}));
  EXPECT_EQ(series[1].second.count, 1u);

  Request odd{Verb::unknown, "/", 11};
  odd.method_string("BREW");
  EXPECT_EQ(method_label(odd), "other");  // a client's method text is never a label
}

// One access line per request, as jupyter_server writes it, its level by status, the path
// without its query and with a hostile client's bytes replaced.
TEST(Metrics, TimedExchangeWritesAnAccessLine) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  sink->set_pattern("%l %v");
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("access", sink));
  spdlog::set_level(spdlog::level::info);
  auto stats = std::make_shared<HttpStats>();
  auto inner = std::make_shared<LambdaExchange>([](Response) {});
  auto answer = [&](std::string_view path, Status status) {
    auto timed = std::make_shared<TimedExchange>(stats, "GET", inner);
    timed->set_path(path);
    Request req{Verb::get, "/", 11};
    timed->reply(json_response(req, status, {}));
  };
  answer("/api/kernels", Status::ok);                     // debug: not at info
  answer("/api/kernels/x\x1b[31m\n", Status::not_found);  // warn, bytes replaced
  answer("/api/kernels/y", Status::internal_server_error);
  answer(std::string(300, 'a'), Status::forbidden);
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  EXPECT_EQ(text.find("200 GET"), std::string::npos) << text;
  EXPECT_NE(text.find("warning 404 GET /api/kernels/x?[31m? ("), std::string::npos) << text;
  EXPECT_NE(text.find("error 500 GET /api/kernels/y ("), std::string::npos) << text;
  EXPECT_NE(text.find("403 GET " + std::string(256, 'a') + "... ("), std::string::npos) << text;
  EXPECT_EQ(text.find(std::string(257, 'a')), std::string::npos) << "capped at 256 bytes";
}

TEST(Metrics, HistogramVecRendersLabelledBucketsAndIsCapped) {
  util::HistogramVec h({"kernelspec", "source"}, {0.5, 2});
  h.observe({"python3", "pool"}, 0.1);
  h.observe({"python3", "pool"}, 1);
  h.observe({"ir \"x\"", "cold"}, 3);
  util::PrometheusText out;
  out.histograms("t_seconds", "Test.", h);
  const std::string& text = out.text();
  EXPECT_NE(text.find("# TYPE t_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("t_seconds_bucket{kernelspec=\"python3\",source=\"pool\",le=\"0.5\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("t_seconds_bucket{kernelspec=\"python3\",source=\"pool\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("t_seconds_sum{kernelspec=\"python3\",source=\"pool\"} 1.1\n"),
            std::string::npos);
  EXPECT_NE(text.find("t_seconds_count{kernelspec=\"ir \\\"x\\\"\",source=\"cold\"} 1\n"),
            std::string::npos)
      << text;

  util::HistogramVec capped({"n"}, {1});
  for (std::size_t i = 0; i < util::HistogramVec::kMaxSeries + 10; ++i) {
    capped.observe({std::to_string(i)}, 0.5);
  }
  EXPECT_EQ(capped.snapshot().size(), util::HistogramVec::kMaxSeries);
}

}  // namespace
}  // namespace cellgate::http
