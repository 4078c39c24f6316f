// gzip for envd's /files (zlib): a streaming compressor for GET with Accept-Encoding: gzip, and
// a bounded decompressor for POST with Content-Encoding: gzip.
//
//   envd::GzipWriter z;                         // per response
//   ex->write(z.add(chunk));                     // compressed bytes so far (may be empty)
//   ex->write(z.finish());
//   auto plain = envd::gunzip(body, limit);      // kResourceExhausted past `limit` bytes
//
// Bounded: add() holds at most one chunk's compressed output; gunzip() stops as soon as the
// output would pass `limit`, so a small bomb costs at most `limit` bytes and the time to inflate
// them.
//
// Thread-safety: a GzipWriter belongs to one thread; gunzip is a pure function.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::envd {

class GzipWriter {
 public:
  GzipWriter();
  ~GzipWriter();
  GzipWriter(const GzipWriter&) = delete;
  GzipWriter& operator=(const GzipWriter&) = delete;

  std::string add(std::string_view bytes);
  std::string finish();  // the rest and the trailer; add() may not follow

 private:
  struct State;
  std::string run(std::string_view bytes, int flush);
  std::unique_ptr<State> state_;
};

// The content of one gzip member; kInvalidArgument ("bad_gzip") for data that is not gzip, is
// cut, or has bytes after its end; kResourceExhausted ("too_large") when it inflates past
// `limit` bytes.
Result<std::string> gunzip(std::string_view gz, std::size_t limit);

// Whether an Accept-Encoding header value accepts gzip (listed, and not with q=0).
bool accepts_gzip(std::string_view accept_encoding);

}  // namespace cellgate::envd
