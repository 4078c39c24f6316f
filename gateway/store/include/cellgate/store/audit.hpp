// AuditLog: one JSON line per execution, with secrets redacted, in a size-rotated file.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto audit, AuditLog::create({.path = state_dir + "/audit.jsonl"}));
//   audit->write({{"kernel_id", id}, {"code_sha256", sha256_hex(code)}, {"status", "ok"}});
//
// write() redacts every string value in the record, at any depth (object keys are kept), with
// each pattern in turn, then appends the line with O_APPEND to a 0600 file (parent directories
// are created 0700). Before a line would take the file over max_bytes, the file is rotated:
// path → path.1 → … → path.<keep>, the oldest dropped. A line longer than max_bytes on its own is
// still written whole, into a fresh file: the audit trail does not lose executions. What bounds a
// line is max_string_bytes: a longer string value is cut (at the last whitespace in its final
// KiB, so a secret is not cut in half and slips past a pattern) and ends "...[truncated N bytes]".
// That also bounds the time redaction takes.
//
// Patterns are RE2 regular expressions (https://github.com/google/re2/wiki/Syntax: Perl's syntax
// without back-references or lookaround), matched bytewise (Latin-1); a leading "(?i)" makes one
// case-insensitive. If a pattern has capture groups, its first group is kept and only the rest
// of the match is replaced ("password=" stays, "hunter2" becomes "[REDACTED]"); use (?:…) for
// grouping otherwise. RE2 matches in time linear in the text and needs no stack per character,
// so a kernel's text (an exception name is in every record of a failed cell) cannot stall or
// crash the writer whatever the pattern; each default pattern also carries the literals its
// matches start with and is only tried where one occurs.
//
// I/O failures never throw: the first of a run is logged with spdlog, the record is dropped, and
// the file is reopened on the next write. Lines are not fsynced.
//
// Thread-safety: write() and redact() may be called from any thread; redaction runs unlocked,
// the append and rotation under a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace re2 {
class RE2;
}

namespace cellgate::store {

// Private key PEM blocks, bearer tokens, AWS access key ids, GitHub and OpenAI-style tokens,
// and key=value pairs whose key says secret (api_key, secret, token, password, passwd,
// authorization; the key is kept). Broad on purpose: "tokens = split(text)" loses its value too.
std::vector<std::string> default_redact_patterns();

struct AuditOptions {
  std::string path;                                   // "" : disabled
  std::uint64_t max_bytes = std::uint64_t{64} << 20;  // rotate before exceeding; 0: never
  unsigned keep = 5;                                  // rotated files kept (path.1 … path.keep)
  std::vector<std::string> redact = default_redact_patterns();  // add to these, or replace them
  std::size_t max_string_bytes = 256u << 10;                    // per string value; 0: no limit
};

class AuditLog {
 public:
  using Options = AuditOptions;

  // bad_redact_pattern (kInvalidArgument) for a pattern RE2 rejects or that matches the empty
  // string. Nothing is opened until the first write().
  static Result<std::unique_ptr<AuditLog>> create(Options options);

  bool enabled() const { return !options_.path.empty(); }
  const std::string& path() const { return options_.path; }

  // Redacts and appends one line; a no-op when disabled.
  void write(nlohmann::json record);

  // `text` with every match of every pattern replaced by "[REDACTED]" (see above).
  std::string redact(std::string_view text) const;

 private:
  struct Pattern {
    std::shared_ptr<const re2::RE2> re;  // shared: RE2 stays out of this header
    bool keep_first_group = false;
    std::vector<std::string> anchors;  // lowercase; a match starts with one. None: try everywhere
  };

  static std::string replace_all(const std::string& text, const Pattern& pattern);
  static std::string replace_anchored(const std::string& text, const Pattern& pattern);

  AuditLog(Options options, std::vector<Pattern> patterns);
  void redact_values(nlohmann::json& record) const;
  Result<void> open_locked() CELLGATE_REQUIRES(mu_);
  Result<void> rotate_locked() CELLGATE_REQUIRES(mu_);
  void fail_locked(const Error& error) CELLGATE_REQUIRES(mu_);

  const Options options_;
  const std::vector<Pattern> patterns_;
  Mutex mu_;
  UniqueFd fd_ CELLGATE_GUARDED_BY(mu_);
  std::uint64_t size_ CELLGATE_GUARDED_BY(mu_) = 0;  // of the open file
  bool failing_ CELLGATE_GUARDED_BY(mu_) = false;    // the last write failed and was logged
};

}  // namespace cellgate::store
