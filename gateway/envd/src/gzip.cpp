// gzip for /files (gzip.hpp), by zlib.
#include "cellgate/envd/gzip.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <limits>

namespace cellgate::envd {
namespace {

constexpr int kGzipWindow = 15 + 16;  // zlib: a window of 2^15 with a gzip header and trailer
constexpr std::size_t kOutChunk = 64 << 10;

Error bad_gzip(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_gzip", std::move(message));
}

}  // namespace

struct GzipWriter::State {
  z_stream z{};
  bool ok = false;
};

GzipWriter::GzipWriter() : state_(std::make_unique<State>()) {
  state_->ok = deflateInit2(&state_->z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, kGzipWindow, 8,
                            Z_DEFAULT_STRATEGY) == Z_OK;
}

GzipWriter::~GzipWriter() {
  if (state_->ok) {
    deflateEnd(&state_->z);
  }
}

std::string GzipWriter::run(std::string_view bytes, int flush) {
  std::string out;
  if (!state_->ok) {
    return out;
  }
  z_stream& z = state_->z;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  char buf[kOutChunk];
  int rc = Z_OK;
  do {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = deflate(&z, flush);
    out.append(buf, sizeof buf - z.avail_out);
  } while (z.avail_out == 0 || (flush == Z_FINISH && rc == Z_OK));
  return out;
}

std::string GzipWriter::add(std::string_view bytes) {
  // Z_SYNC_FLUSH: what a chunk holds reaches the client now, not when the buffer fills (a
  // streamed file's reader sees its bytes as they are read).
  return run(bytes, Z_SYNC_FLUSH);
}

std::string GzipWriter::finish() {
  return run({}, Z_FINISH);
}

Result<std::string> gunzip(std::string_view gz, std::size_t limit) {
  if (gz.size() > std::numeric_limits<uInt>::max()) {
    return bad_gzip("the gzip data exceeds 4 GiB");
  }
  z_stream z{};
  if (inflateInit2(&z, kGzipWindow) != Z_OK) {
    return make_error(ErrorCode::kInternal, "zlib", "inflateInit2 failed (out of memory?)");
  }
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&z};
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  std::string out;
  char buf[kOutChunk];
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    const int rc = inflate(&z, Z_NO_FLUSH);
    const std::size_t n = sizeof buf - z.avail_out;
    if (out.size() + n > limit) {
      return make_error(
          ErrorCode::kResourceExhausted, "too_large",
          "the gzip upload inflates past " + std::to_string(limit) + " bytes (the upload limit)");
    }
    out.append(buf, n);
    if (rc == Z_STREAM_END) {
      if (z.avail_in != 0) {
        return bad_gzip("bytes after the end of the gzip data");
      }
      return out;
    }
    if (rc == Z_BUF_ERROR && z.avail_in == 0 && n == 0) {
      return bad_gzip("the gzip data is cut short");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return bad_gzip(std::string("not gzip data: ") + (z.msg != nullptr ? z.msg : "zlib error"));
    }
  }
}

bool accepts_gzip(std::string_view value) {
  // RFC 9110 §12.5.3: a list of codings with optional ;q=; "gzip;q=0" refuses it.
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    const std::size_t semi = item.find(';');
    std::string_view name = item.substr(0, semi);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front())) != 0) {
      name.remove_prefix(1);
    }
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back())) != 0) {
      name.remove_suffix(1);
    }
    if (name.size() != 4 || !std::equal(name.begin(), name.end(), "gzip", [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      continue;
    }
    if (semi == std::string_view::npos) {
      return true;
    }
    std::string params(item.substr(semi + 1));
    params.erase(std::remove_if(params.begin(), params.end(),
                                [](unsigned char c) { return std::isspace(c) != 0; }),
                 params.end());
    // q=0, q=0., q=0.0, q=0.00, q=0.000 refuse; any other q accepts.
    return !(params.rfind("q=0", 0) == 0 && params.find_first_not_of("0.", 2) == std::string::npos);
  }
  return false;
}

}  // namespace cellgate::envd
