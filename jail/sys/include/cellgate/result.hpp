// Result<T>: a value or an Error, returned at every module boundary of cellgate.
//
// g++ 12 has no std::expected, so this is a small type shaped like it. Errors carry one of a
// few canonical codes (mapped to HTTP statuses in one place, the gateway's error mapper), a short
// machine-readable reason ("bad_signature") and a message for people.
//
//   Result<int> parse_port(std::string_view s);
//   CELLGATE_ASSIGN_OR_RETURN(int port, parse_port(text));
//   if (auto r = do_thing(); !r) { log(r.error().message); }
//
// Thread-safety: a value type; no shared state.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace cellgate {

// Canonical error codes, after abseil's. Keep this list short.
enum class ErrorCode {
  kInvalidArgument,     // the caller sent something malformed (HTTP 400)
  kNotFound,            // no such thing (404)
  kFailedPrecondition,  // the system is not in a state to do it (409)
  kResourceExhausted,   // a limit was reached (429/503)
  kDeadlineExceeded,    // it took too long (504)
  kPermissionDenied,    // not allowed (403)
  kUnauthenticated,     // no valid credentials (401)
  kUnavailable,         // a peer (kernel) is gone or not answering (503)
  kInternal,            // a bug or an environment fault (500)
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string reason;   // short, stable, machine-readable: "bad_signature"
  std::string message;  // for people: what failed and, where it helps, what to do

  std::string describe() const { return reason + ": " + message; }
};

inline Error make_error(ErrorCode code, std::string reason, std::string message) {
  return Error{code, std::move(reason), std::move(message)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const& {
    assert(!ok_);
    return error_;
  }
  Error&& error() && {
    assert(!ok_);
    return std::move(error_);
  }

 private:
  Error error_;
  bool ok_ = true;
};

inline Result<void> ok_result() {
  return {};
}

}  // namespace cellgate

#define CELLGATE_CONCAT_INNER(a, b) a##b
#define CELLGATE_CONCAT(a, b) CELLGATE_CONCAT_INNER(a, b)

// Returns the error of a failed Result<...> from the enclosing function.
#define CELLGATE_TRY(expr)                            \
  do {                                                \
    auto cellgate_try_result_ = (expr);               \
    if (!cellgate_try_result_.ok()) {                 \
      return std::move(cellgate_try_result_).error(); \
    }                                                 \
  } while (false)

// Declares `lhs` from a successful Result, or returns its error. `tmp` and `lhs` are names
// being declared (`const auto [a, b]`, `int port`), which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define CELLGATE_ASSIGN_OR_RETURN(lhs, expr) \
  CELLGATE_ASSIGN_OR_RETURN_IMPL(CELLGATE_CONCAT(cellgate_result_, __LINE__), lhs, expr)
#define CELLGATE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) {                                     \
    return std::move(tmp).error();                     \
  }                                                    \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace cellgate {
// An Error naming the failed call and errno, as nsjail's PLOG does: "open('/x', O_RDONLY): ENOENT
// (No such file or directory)".
Error errno_error(ErrorCode code, std::string reason, const std::string& call, int err);
}  // namespace cellgate
