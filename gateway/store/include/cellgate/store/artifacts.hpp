// ArtifactStore: every image, SVG and PDF a kernel displays, stored once by SHA-256, plus a
// per-kernel list of what each cell displayed or wrote.
//
//   ArtifactStore store(state_dir + "/artifacts", ArtifactCaps{});
//   auto rec = store.put(kernel_id, content["execution_count"], "image/png", bundle["image/png"]);
//   if (!rec && rec.error().reason == "artifact_cap") { /* tell the client once */ }
//   auto where = store.locate(rec->sha256);  // {"<dir>/ab/ab12…", "image/png"} for GET
//
// Layout: content at <dir>/<sha[0:2]>/<sha> (0600, directories 0700), written to a temp file and
// renamed, so a reader never sees half a file; content already there is not written again.
// Every record is also appended as one JSON line to <dir>/index/<kernel_id>.jsonl, a journal for
// people; the store does not read it back (after a restart, locate() sniffs the mime instead).
//
// Jupyter sends binary mimes base64-encoded, SVG as text, and either as a string or an array of
// lines (nbformat's "multiline_string";
// https://nbformat.readthedocs.io/en/latest/format_description.html).
//
// Caps are per kernel. The count cap bounds records (so memory and the journal): every put() or
// record_file() that succeeds counts, including a repeat of an image the kernel showed before.
// The bytes cap counts each distinct SHA-256 once per kernel: showing the same plot in ten cells
// records it ten times (each with its execution_count) but costs its bytes once. A put() over a
// cap stores nothing and fails with reason "artifact_cap" (kResourceExhausted); the same reason is
// used for the one-artifact size cap, the message says which cap it was.
//
// Thread-safety: all methods may be called from any thread. Decoding and hashing run unlocked;
// the cap check, the content write (bounded by max_artifact_bytes) and the index update run under
// one mutex, so concurrent puts of the same content write it once.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"

namespace cellgate::store {

// Lowercase hex SHA-256 of `data` (OpenSSL EVP); "" only if OpenSSL cannot allocate.
std::string sha256_hex(std::string_view data);

struct ArtifactRecord {
  std::string kind = "display";  // "display": stored content; "file": a work-dir file a cell wrote
  std::string sha256;            // display: always; file: optional
  std::string mime_type;         // display: always; file: optional
  std::uint64_t size = 0;        // bytes of content (display: decoded)
  std::string path;              // file: relative to the kernel's work dir
  std::string kernel_id;
  nlohmann::json execution_count;  // the cell's number, or null
  std::string created;             // ISO 8601 UTC

  // {"kind", "kernel_id", "execution_count", "size", "created"} plus sha256 and mime_type
  // (display, or file when set) and path (file).
  nlohmann::json to_json() const;
};

struct ArtifactCaps {
  std::size_t count = 1000;                                    // records per kernel
  std::uint64_t bytes = std::uint64_t{256} << 20;              // distinct content per kernel
  std::uint64_t max_artifact_bytes = std::uint64_t{32} << 20;  // one decoded artifact
};

class ArtifactStore {
 public:
  using Caps = ArtifactCaps;

  // `dir` is created (0700) on the first put, not here.
  explicit ArtifactStore(std::string dir, Caps caps = {});

  // image/png, image/jpeg, image/gif, image/svg+xml, application/pdf.
  static bool is_artifact_mime(std::string_view mime);

  // Decodes `value` (a string or array of strings), stores it and records it for the kernel.
  // Errors: unsupported_mime, bad_artifact (not a string/array, empty), bad_base64,
  // bad_kernel_id (kInvalidArgument); artifact_cap (kResourceExhausted); artifact_io (kInternal).
  Result<ArtifactRecord> put(const std::string& kernel_id, const nlohmann::json& execution_count,
                             const std::string& mime, const nlohmann::json& value);

  // Records a file a cell created or changed (kind "file"); nothing is copied. Counts towards the
  // count cap only.
  Result<ArtifactRecord> record_file(const std::string& kernel_id,
                                     const nlohmann::json& execution_count, std::string path,
                                     std::uint64_t size, std::string sha256 = {},
                                     std::string mime_type = {});

  // The kernel's records in the order they were made; empty for an unknown kernel.
  std::vector<ArtifactRecord> list(const std::string& kernel_id) const;

  // The content file and its Content-Type. bad_sha (kInvalidArgument) unless 64 lowercase hex
  // digits; no_artifact (kNotFound). The mime comes from the records in memory, else from the
  // file's magic bytes, else application/octet-stream.
  Result<std::pair<std::string, std::string>> locate(const std::string& sha256) const;

  // Drops the kernel's records and cap usage (kernel deleted). Content stays: other kernels may
  // share it. The kernel's journal stays too.
  void forget(const std::string& kernel_id);

  const std::string& dir() const { return dir_; }

 private:
  struct KernelIndex {
    std::vector<ArtifactRecord> records;
    std::unordered_map<std::string, std::string> mimes;  // distinct display sha256 → mime
    std::uint64_t bytes = 0;                             // sum of sizes of `mimes`
  };

  Result<void> write_content(const std::string& sha256, std::string_view bytes);
  void append_index(const ArtifactRecord& record) CELLGATE_REQUIRES(mu_);

  const std::string dir_;
  const Caps caps_;
  mutable Mutex mu_;
  std::unordered_map<std::string, KernelIndex> kernels_ CELLGATE_GUARDED_BY(mu_);
  bool index_warned_ CELLGATE_GUARDED_BY(mu_) =
      false;  // the journal failed and it was logged; reset on success
};

}  // namespace cellgate::store
