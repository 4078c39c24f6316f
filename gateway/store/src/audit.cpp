#include "cellgate/store/audit.hpp"

#include <fcntl.h>
#include <re2/re2.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

#include "cellgate/protocol/message.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::store {
namespace {

constexpr std::string_view kRedacted = "[REDACTED]";
constexpr std::size_t kCutBackLimit = 1024;  // how far a cut string backs off to whitespace

// rename()/unlink() where a missing source is fine (fewer rotated files than `keep` so far).
Result<void> rename_if_exists(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT) {
    return errno_error(ErrorCode::kInternal, "audit_io", "rename('" + from + "', '" + to + "')",
                       errno);
  }
  return {};
}

Result<void> unlink_if_exists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return errno_error(ErrorCode::kInternal, "audit_io", "unlink('" + path + "')", errno);
  }
  return {};
}

// Cuts `text` to at most `limit` bytes, on a UTF-8 boundary, backing off to the last whitespace
// in the final KiB so that a token is dropped whole rather than left as a prefix a pattern
// might no longer match.
void truncate_string(std::string& text, std::size_t limit) {
  if (limit == 0 || text.size() <= limit) {
    return;
  }
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) {
    --cut;
  }
  for (std::size_t i = cut; i > 0 && cut - i < kCutBackLimit; --i) {
    const char c = text[i - 1];
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      cut = i;
      break;
    }
  }
  const std::size_t dropped = text.size() - cut;
  text.resize(cut);
  text += "...[truncated " + std::to_string(dropped) + " bytes]";
}

// The defaults, each with the literals (lowercase) its matches start with.
struct DefaultPattern {
  std::string_view source;
  std::vector<std::string_view> anchors;
};

const std::vector<DefaultPattern>& default_table() {
  static const std::vector<DefaultPattern> table = {
      // PEM private keys, to the END line or, when it is missing (a cut string), to the end.
      {R"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$))",
       {"-----begin "}},
      // RFC 6750 bearer tokens, "Bearer " kept.
      {R"((?i)(\bbearer[ \t]+)[A-Za-z0-9._~+/-]+=*)", {"bearer"}},
      // AWS access key ids (long-term AKIA, temporary ASIA).
      {R"(\b(?:AKIA|ASIA)[0-9A-Z]{16}\b)", {"akia", "asia"}},
      // GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained.
      {R"(\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{22,})",
       {"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"}},
      // OpenAI-style secret keys (sk-..., sk-proj-...).
      {R"(\bsk-[A-Za-z0-9_-]{20,})", {"sk-"}},
      // key=value / key: value / "key": "value", the key and separator kept. A quoted value is
      // taken whole (bounded, so a stray quote cannot make the search quadratic), and an
      // Authorization scheme goes with its credentials.
      {R"((?i)((?:api[_-]?key|secret|token|password|passwd|authorization)(?:[_-][A-Za-z0-9]+)*)"
       R"(["']?[ \t]*[=:][ \t]*)(?:(?:bearer|basic|token)[ \t]+)?)"
       R"((?:"[^"\r\n]{0,256}"|'[^'\r\n]{0,256}'|\S+))",
       {"api", "secret", "token", "password", "passwd", "authorization"}},
  };
  return table;
}

std::string ascii_lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return lower;
}

}  // namespace

std::vector<std::string> default_redact_patterns() {
  std::vector<std::string> sources;
  for (const DefaultPattern& p : default_table()) {
    sources.emplace_back(p.source);
  }
  return sources;
}

Result<std::unique_ptr<AuditLog>> AuditLog::create(Options options) {
  std::vector<Pattern> patterns;
  patterns.reserve(options.redact.size());
  for (const std::string& source : options.redact) {
    // Latin-1: bytes are matched as they are (a kernel's text need not be valid UTF-8), as
    // std::regex over std::string did. RE2 understands "(?i)" itself.
    RE2::Options re_options(RE2::Latin1);
    re_options.set_log_errors(false);
    auto re = std::make_shared<const RE2>(source, re_options);
    if (!re->ok()) {
      return make_error(
          ErrorCode::kInvalidArgument, "bad_redact_pattern",
          "redact pattern '" + source + "' is not a valid RE2 regular expression: " + re->error());
    }
    if (RE2::PartialMatch("", *re)) {
      return make_error(
          ErrorCode::kInvalidArgument, "bad_redact_pattern",
          "redact pattern '" + source + "' matches the empty string; it would redact everything");
    }
    Pattern pattern{std::move(re), false, {}};
    pattern.keep_first_group = pattern.re->NumberOfCapturingGroups() > 0;
    for (const DefaultPattern& d : default_table()) {
      if (d.source == source) {
        pattern.anchors.assign(d.anchors.begin(), d.anchors.end());
      }
    }
    patterns.push_back(std::move(pattern));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(options), std::move(patterns)));
}

AuditLog::AuditLog(Options options, std::vector<Pattern> patterns)
    : options_(std::move(options)), patterns_(std::move(patterns)) {}

std::string AuditLog::redact(std::string_view text) const {
  std::string out(text);
  for (const Pattern& p : patterns_) {
    out = p.anchors.empty() ? replace_all(out, p) : replace_anchored(out, p);
  }
  return out;
}

namespace {

// The match of `pattern` that starts at or after `from` (only at `from` when `anchored`), in
// `m[0]` (the whole match) and `m[1]` (the first group, when there is one). RE2 sees the whole
// text, so \b and ^ judge `from` by the byte before it.
bool match_at(const RE2& re, const std::string& text, std::size_t from, bool anchored,
              re2::StringPiece* m, int groups) {
  return re.Match(text, from, text.size(), anchored ? RE2::ANCHOR_START : RE2::UNANCHORED, m,
                  groups);
}

}  // namespace

// Every non-empty match replaced, left to right; an empty match (a pattern like \b) replaces
// nothing. One RE2 search per match: linear in the text.
std::string AuditLog::replace_all(const std::string& text, const Pattern& pattern) {
  const int groups = pattern.keep_first_group ? 2 : 1;
  re2::StringPiece m[2];
  std::string out;
  std::size_t copied = 0;
  std::size_t from = 0;
  while (from <= text.size() && match_at(*pattern.re, text, from, false, m, groups)) {
    const auto start = static_cast<std::size_t>(m[0].data() - text.data());
    const std::size_t end = start + m[0].size();
    if (m[0].empty()) {
      from = start + 1;
      continue;
    }
    out.append(text, copied, start - copied);
    if (pattern.keep_first_group && m[1].data() != nullptr) {
      out.append(m[1].data(), m[1].size());
    }
    out += kRedacted;
    copied = end;
    from = end;
  }
  if (copied == 0) {
    return text;
  }
  out.append(text, copied);
  return out;
}

// replace_all(), trying the pattern only where an anchor occurs: leftmost match first,
// then on after its end.
std::string AuditLog::replace_anchored(const std::string& text, const Pattern& pattern) {
  const std::string lower = ascii_lower(text);
  std::vector<std::size_t> next;  // the next occurrence of each anchor at or after `from`
  for (const std::string& anchor : pattern.anchors) {
    next.push_back(lower.find(anchor));
  }
  const int groups = pattern.keep_first_group ? 2 : 1;
  re2::StringPiece m[2];
  std::string out;
  std::size_t copied = 0;
  std::size_t from = 0;
  for (;;) {
    std::size_t at = std::string::npos;
    for (std::size_t i = 0; i < next.size(); ++i) {
      if (next[i] != std::string::npos && next[i] < from) {
        next[i] = lower.find(pattern.anchors[i], from);
      }
      at = std::min(at, next[i]);
    }
    if (at == std::string::npos) {
      break;
    }
    if (match_at(*pattern.re, text, at, true, m, groups) && !m[0].empty()) {
      out.append(text, copied, at - copied);
      if (pattern.keep_first_group && m[1].data() != nullptr) {
        out.append(m[1].data(), m[1].size());
      }
      out += kRedacted;
      copied = at + m[0].size();
      from = copied;
    } else {
      from = at + 1;
    }
  }
  if (copied == 0) {
    return text;
  }
  out.append(text, copied);
  return out;
}

// Every string value of the record, at any depth, without recursion: a record is the gateway's
// own, but what it holds came from a kernel.
void AuditLog::redact_values(nlohmann::json& record) const {
  std::vector<nlohmann::json*> pending = {&record};
  while (!pending.empty()) {
    nlohmann::json& value = *pending.back();
    pending.pop_back();
    if (value.is_string()) {
      auto& text = value.get_ref<std::string&>();
      truncate_string(text, options_.max_string_bytes);
      text = redact(text);
    } else if (value.is_structured()) {
      for (auto& item : value) {  // an object's values; its keys are kept as they are
        pending.push_back(&item);
      }
    }
  }
}

void AuditLog::write(nlohmann::json record) {
  if (!enabled()) {
    return;
  }
  std::string line;
  try {
    redact_values(record);
    line = protocol::dump_json(record);
    line += '\n';
  } catch (const std::exception& e) {
    MutexLock lock(mu_);
    fail_locked(make_error(ErrorCode::kInternal, "audit_record",
                           std::string("cannot serialize the record: ") + e.what()));
    return;
  }

  MutexLock lock(mu_);
  if (!fd_) {
    if (auto opened = open_locked(); !opened) {
      fail_locked(opened.error());
      return;
    }
  }
  bool clean = true;
  if (options_.max_bytes > 0 && size_ > 0 && size_ + line.size() > options_.max_bytes) {
    // A rotation that fails leaves the line to go on the current file: too big beats lost.
    if (auto rotated = rotate_locked(); !rotated) {
      fail_locked(rotated.error());
      clean = false;
    }
    if (!fd_) {
      if (auto opened = open_locked(); !opened) {
        fail_locked(opened.error());
        return;
      }
    }
  }
  std::string_view rest = line;
  while (!rest.empty()) {
    const ssize_t n = ::write(fd_.get(), rest.data(), rest.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      fail_locked(
          errno_error(ErrorCode::kInternal, "audit_io", "write('" + options_.path + "')", errno));
      fd_.reset();  // reopened by the next write
      return;
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
    size_ += static_cast<std::uint64_t>(n);
  }
  if (clean) {
    failing_ = false;
  }
}

Result<void> AuditLog::open_locked() {
  const std::string& path = options_.path;
  if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    CELLGATE_TRY(make_private_dirs(path.substr(0, slash), "audit_io"));
  }
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "audit_io", "open('" + path + "', O_APPEND)", errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_error(ErrorCode::kInternal, "audit_io", "fstat('" + path + "')", errno);
  }
  fd_ = std::move(fd);
  size_ = static_cast<std::uint64_t>(st.st_size);
  return {};
}

// path.<keep> is dropped, path.<i> becomes path.<i+1>, path becomes path.1. Closes the file.
Result<void> AuditLog::rotate_locked() {
  const std::string& path = options_.path;
  fd_.reset();
  size_ = 0;
  if (options_.keep == 0) {
    return unlink_if_exists(path);
  }
  CELLGATE_TRY(unlink_if_exists(path + "." + std::to_string(options_.keep)));
  for (unsigned i = options_.keep - 1; i >= 1; --i) {
    CELLGATE_TRY(
        rename_if_exists(path + "." + std::to_string(i), path + "." + std::to_string(i + 1)));
  }
  return rename_if_exists(path, path + ".1");
}

void AuditLog::fail_locked(const Error& error) {
  if (!failing_) {
    spdlog::error("audit log: {}; records are dropped or kept unrotated until it works again",
                  error.describe());
  }
  failing_ = true;
}

}  // namespace cellgate::store
