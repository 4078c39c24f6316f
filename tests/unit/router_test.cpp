// The one router: patterns, parameters, the rest of a path, 404 vs 405, percent-decoding.
#include "cellgate/http/router.hpp"

#include <gtest/gtest.h>

namespace cellgate::http {
namespace {

Call call_for(Verb method, std::string target) {
  Request req{method, target, 11};
  Call c{req, std::make_shared<LambdaExchange>([](Response) {}), Target::parse(target), {}};
  return c;
}

TEST(Router, MatchesLiteralsAndParameters) {
  Router r;
  std::string seen;
  r.add(Verb::get, "/api/kernels", [&](Call&) { seen = "list"; });
  r.add(Verb::get, "/api/kernels/{id}", [&](Call& c) { seen = "get " + c.param("id"); });
  r.add(Verb::post, "/api/kernels/{id}/execute", [&](Call& c) { seen = "exec " + c.param("id"); });

  auto c1 = call_for(Verb::get, "/api/kernels");
  EXPECT_EQ(r.dispatch(c1), Router::Match::kFound);
  EXPECT_EQ(seen, "list");
  auto c2 = call_for(Verb::get, "/api/kernels/abc?x=1");
  EXPECT_EQ(r.dispatch(c2), Router::Match::kFound);
  EXPECT_EQ(seen, "get abc");
  EXPECT_EQ(c2.target.query.at("x"), "1");
  auto c3 = call_for(Verb::post, "/api/kernels/k%2D1/execute");
  EXPECT_EQ(r.dispatch(c3), Router::Match::kFound);
  EXPECT_EQ(seen, "exec k-1");
}

TEST(Router, WrongMethodIsNotAWrongPath) {
  Router r;
  bool ran = false;
  r.add(Verb::get, "/api/kernels/{id}", [&](Call&) { ran = true; });
  auto c = call_for(Verb::put, "/api/kernels/abc");
  EXPECT_EQ(r.dispatch(c), Router::Match::kNoMethod);
  auto d = call_for(Verb::get, "/api/kernels/abc/more");
  EXPECT_EQ(r.dispatch(d), Router::Match::kNoPath);
  auto e = call_for(Verb::get, "/api");
  EXPECT_EQ(r.dispatch(e), Router::Match::kNoPath);
  EXPECT_FALSE(ran);
}

TEST(Router, RestParameterTakesTheDecodedRemainder) {
  Router r;
  std::string path = "unset";
  r.add(Verb::get, "/files/{path*}", [&](Call& c) { path = c.param("path"); });
  auto c = call_for(Verb::get, "/files/a/b%20c/d.csv");
  EXPECT_EQ(r.dispatch(c), Router::Match::kFound);
  EXPECT_EQ(path, "a/b c/d.csv");
  auto empty = call_for(Verb::get, "/files");
  EXPECT_EQ(r.dispatch(empty), Router::Match::kFound);
  EXPECT_EQ(path, "");
}

TEST(Router, FirstMatchingEntryWins) {
  Router r;
  std::string seen;
  r.add(Verb::get, "/api/kernels/{id}/artifacts", [&](Call&) { seen = "artifacts"; });
  r.add(Verb::get, "/api/kernels/{id}/{what}", [&](Call& c) { seen = "other " + c.param("what"); });
  auto a = call_for(Verb::get, "/api/kernels/k/artifacts");
  r.dispatch(a);
  EXPECT_EQ(seen, "artifacts");
  auto b = call_for(Verb::get, "/api/kernels/k/files");
  r.dispatch(b);
  EXPECT_EQ(seen, "other files");
}

TEST(Target, DecodesQueryKeysAndValues) {
  auto t = Target::parse("/p?token=a%2Bb&session_id=x+y&flag");
  EXPECT_EQ(t.path, "/p");
  EXPECT_EQ(t.query.at("token"), "a+b");
  EXPECT_EQ(t.query.at("session_id"), "x y");
  EXPECT_EQ(t.query.at("flag"), "");
}

TEST(StatusFor, OneMapForEveryCode) {
  EXPECT_EQ(status_for(make_error(ErrorCode::kNotFound, "x", "")), Status::not_found);
  EXPECT_EQ(status_for(make_error(ErrorCode::kResourceExhausted, "max_kernels", "")),
            Status::forbidden);
  EXPECT_EQ(status_for(make_error(ErrorCode::kResourceExhausted, "too_large", "")),
            Status::payload_too_large);
  EXPECT_EQ(status_for(make_error(ErrorCode::kResourceExhausted, "no_space", "")),
            Status::insufficient_storage);
  EXPECT_EQ(status_for(make_error(ErrorCode::kDeadlineExceeded, "t", "")), Status::gateway_timeout);
}

TEST(StatusFor, HibernateWhereCheckpointsCannotWorkIs501) {
  EXPECT_EQ(status_for(make_error(ErrorCode::kFailedPrecondition, "checkpoints_unavailable", "")),
            Status::not_implemented);
  // The other refusals of a hibernate stay 409: a busy kernel, a zygote-forked one.
  EXPECT_EQ(status_for(make_error(ErrorCode::kFailedPrecondition, "kernel_busy", "")),
            Status::conflict);
  EXPECT_EQ(status_for(make_error(ErrorCode::kFailedPrecondition, "not_hibernatable", "")),
            Status::conflict);
}

}  // namespace
}  // namespace cellgate::http
