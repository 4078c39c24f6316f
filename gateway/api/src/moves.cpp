// Moving a kernel to another node (docs/scale-out.md, "Moving kernels"; cellgate drain --move).
//
//   POST /api/kernels/{id}/move {"to": "0002"}    on the kernel's node; "to" optional
//     → the registry checkpoints the kernel into a tar archive (kernels/src/moves.cpp) and this
//       node uploads it to the peer:
//   POST /api/node/imports {"manifest": {...}, "signature": hex}   → 201 {"import": iid}
//   PUT  /api/node/imports/{iid}?offset=N   (application/octet-stream, ≤ 4 MiB a part, in order)
//   POST /api/node/imports/{iid}/restore    → 201 {"kernel": model, "sessions": [...]}
//     → 200 {"id", "node": "0002", "sessions": [ids]}; the kernel ends here, its ids answer 503
//       "kernel_moved" until the routers send them to their new node (cellgate drain --move
//       --router tells them).
//
// Restoring an image runs its processes as whatever it says, so the receiving node takes only
// what a peer holding the cluster's move key (--move-key-file) signed: the manifest (kernel id,
// kernelspec, connection key, client env, sessions, the archive's size and SHA-256, the sending
// and receiving node's tags, a nonce and an expiry) carries an HMAC-SHA256 under that key; the
// archive is hashed as it arrives and unpacked only when it is exactly the size and digest the
// signed manifest names. A manifest is taken once (its nonce), by the node it names, before it
// expires. The API token alone (a client's) cannot move a kernel onto a node.
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cellgate/api/api.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/message.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "peers.hpp"
#include "spdlog/spdlog.h"

namespace cellgate::api {

using http::Call;
using http::error_response;
using http::json_response;
using http::Response;
using http::Status;
using http::Verb;
using nlohmann::json;

namespace {

constexpr std::size_t kPartBytes = 4u << 20;  // one upload request's body
constexpr int kManifestSeconds = 600;         // a manifest's life: the upload and the restore
constexpr std::size_t kMaxImports = 8;        // arriving at once
constexpr std::chrono::milliseconds kPeerAsk{2000};
constexpr std::chrono::milliseconds kPartTimeout{60000};
constexpr std::chrono::milliseconds kRestoreTimeout{180000};

std::string to_hex(const unsigned char* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

// The manifest's HMAC-SHA256 under the move key, hex: the Jupyter wire's own signer over one
// part (HMAC of the concatenated parts; the others empty). Constant-time verify.
protocol::Signer move_signer(const std::string& key) {
  return std::move(protocol::Signer::create("hmac-sha256", key).value());
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Error moves_off() {
  return make_error(ErrorCode::kFailedPrecondition, "moves_unavailable",
                    "this node moves no kernel: it was started without --move-key-file (the "
                    "secret the cluster's nodes share to sign kernel archives)");
}

// SHA-256 of a whole file, read in parts; "" when it cannot be read.
std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return {};
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::string buf(1u << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  return to_hex(md, len);
}

}  // namespace

// Archives arriving here: each is a signed manifest and the file its parts are appended to, in
// <state_dir>/imports (0700). Thread-safe; an import is used by one request at a time (`busy`).
class Imports {
 public:
  struct Import {
    json manifest;
    std::string path;
    std::uint64_t received = 0;
    std::int64_t expires = 0;
    bool busy = false;
  };

  explicit Imports(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }

  // A new import for a verified manifest; refuses a nonce seen before and more than
  // kMaxImports at once (expired ones are dropped first).
  Result<std::string> open(json manifest) {
    std::lock_guard lock(mu_);
    drop_expired();
    const std::string nonce = manifest.value("nonce", "");
    if (nonce.empty() || !nonces_.emplace(nonce, manifest.value("expires", 0LL)).second) {
      return make_error(ErrorCode::kPermissionDenied, "move_replayed",
                        "this manifest was used before");
    }
    if (imports_.size() >= kMaxImports) {
      return make_error(
          ErrorCode::kResourceExhausted, "too_many_imports",
          "this node takes " + std::to_string(kMaxImports) + " kernels at once; try again");
    }
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    ::chmod(dir_.c_str(), 0700);
    const std::string iid = kernel::random_hex(16);
    Import im;
    im.path = dir_ + "/" + iid + ".tar";
    im.expires = manifest.value("expires", 0LL);
    im.manifest = std::move(manifest);
    std::ofstream(im.path, std::ios::binary | std::ios::trunc);  // exists, empty
    ::chmod(im.path.c_str(), 0600);
    imports_[iid] = std::move(im);
    return iid;
  }

  // The import `iid`, marked busy (one request at a time), or why not.
  Result<Import*> take(const std::string& iid) {
    std::lock_guard lock(mu_);
    drop_expired();
    auto it = imports_.find(iid);
    if (it == imports_.end()) {
      return make_error(ErrorCode::kNotFound, "no_import", "no import " + iid + " (or it expired)");
    }
    if (it->second.busy) {
      return make_error(ErrorCode::kFailedPrecondition, "import_busy",
                        "import " + iid + " is in use by another request");
    }
    it->second.busy = true;
    return &it->second;
  }
  void give_back(const std::string& iid) {
    std::lock_guard lock(mu_);
    if (auto it = imports_.find(iid); it != imports_.end()) {
      it->second.busy = false;
    }
  }
  // Ends an import (its file is removed).
  void close(const std::string& iid) {
    std::lock_guard lock(mu_);
    if (auto it = imports_.find(iid); it != imports_.end()) {
      std::error_code ec;
      std::filesystem::remove(it->second.path, ec);
      imports_.erase(it);
    }
  }

 private:
  void drop_expired() {
    const std::int64_t now = unix_now();
    for (auto it = imports_.begin(); it != imports_.end();) {
      if (!it->second.busy && it->second.expires < now) {
        std::error_code ec;
        std::filesystem::remove(it->second.path, ec);
        it = imports_.erase(it);
      } else {
        ++it;
      }
    }
    std::erase_if(nonces_, [now](const auto& n) { return n.second < now; });
  }

  const std::string dir_;
  std::mutex mu_;
  std::map<std::string, Import> imports_;
  std::map<std::string, std::int64_t> nonces_;  // nonce → its manifest's expiry
};

Result<std::string> Api::send_kernel(const kernels::MovedKernel& moved, const std::string& to,
                                     const std::vector<Session>& sessions) {
  std::string base = options_.base_url;
  while (!base.empty() && base.back() == '/') {
    base.pop_back();
  }
  // Where: a peer that is not this node, not draining, with room (the most, unless `to` names
  // one).
  std::vector<std::string> unresolved;
  std::optional<http::client::Url> target;
  std::string target_tag;
  int best_room = 0;
  for (const auto& url : resolve_peers(options_.node, base, unresolved)) {
    http::client::Client client(url, options_.token, "cellgate-move");
    auto answer = client.request("GET", "/api/node", "", kPeerAsk);
    json node = answer && answer->status == 200 ? http::parse_json(answer->body) : json();
    if (!node.is_object() || !node.contains("tag") || !node["tag"].is_string()) {
      continue;
    }
    const std::string tag = node["tag"].get<std::string>();
    const int room = node.value("room_percent", 0);
    if (tag == node_tag_ || node.value("draining", false) || (!to.empty() && tag != to)) {
      continue;
    }
    if (room > best_room) {
      best_room = room;
      target = url;
      target_tag = tag;
    }
  }
  if (!target) {
    return make_error(ErrorCode::kUnavailable, "no_node_for_move",
                      to.empty() ? "no peer has room for the kernel (peers that answered are "
                                   "draining or full)"
                                 : "node " + to + " is not a peer with room that answered");
  }
  std::error_code ec;
  const std::uint64_t bytes = std::filesystem::file_size(moved.archive, ec);
  if (ec) {
    return make_error(ErrorCode::kInternal, "move_archive", "the archive is gone: " + ec.message());
  }
  json session_list = json::array();
  for (const auto& s : sessions) {
    session_list.push_back({{"id", s.id}, {"path", s.path}, {"name", s.name}, {"type", s.type}});
  }
  const json manifest = {{"v", 1},
                         {"kernel_id", moved.id},
                         {"kernel_name", moved.kernel_name},
                         {"key", moved.key},
                         {"env", moved.env},
                         {"sessions", session_list},
                         {"bytes", bytes},
                         {"sha256", file_sha256(moved.archive)},
                         {"from", node_tag_},
                         {"to", target_tag},
                         {"nonce", kernel::random_hex(16)},
                         {"expires", unix_now() + kManifestSeconds}};
  http::client::Client client(*target, options_.token, "cellgate-move");
  auto failed = [&](const std::string& step, const Result<http::client::Response>& answer) {
    const std::string why =
        !answer ? answer.error().message
                : "HTTP " + std::to_string(answer->status) + ": " + answer->error_message();
    return make_error(ErrorCode::kUnavailable, "move_failed",
                      "node " + target_tag + " " + step + ": " + why);
  };
  auto opened = client.request(
      "POST", "/api/node/imports",
      json{{"manifest", manifest},
           {"signature", move_signer(options_.node.move_key).sign(manifest.dump(), "", "", "")}}
          .dump(),
      kPeerAsk * 5);
  if (!opened || opened->status != 201) {
    return failed("refused the manifest", opened);
  }
  json import = http::parse_json(opened->body);
  const std::string iid = import.is_object() ? import.value("import", "") : "";
  if (iid.empty()) {
    return make_error(ErrorCode::kUnavailable, "move_failed",
                      "node " + target_tag + " answered no import id");
  }
  std::ifstream in(moved.archive, std::ios::binary);
  std::string part(kPartBytes, '\0');
  for (std::uint64_t offset = 0; offset < bytes;) {
    in.read(part.data(), static_cast<std::streamsize>(part.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    if (n == 0) {
      return make_error(ErrorCode::kInternal, "move_archive", "the archive ended early");
    }
    auto put =
        client.request("PUT", "/api/node/imports/" + iid + "?offset=" + std::to_string(offset),
                       part.substr(0, n), kPartTimeout, "application/octet-stream");
    if (!put || put->status != 200) {
      return failed("refused a part of the archive", put);
    }
    offset += n;
  }
  auto restored =
      client.request("POST", "/api/node/imports/" + iid + "/restore", "{}", kRestoreTimeout);
  if (!restored || restored->status != 201) {
    return failed("could not restore the kernel", restored);
  }
  return target_tag;
}

void Api::add_move_routes() {
  imports_ = std::make_shared<Imports>(
      options_.state_dir.empty() ? std::string() : options_.state_dir + "/imports");
  // {"to": "0002"} (optional): the node to move to; else the peer with the most room.
  router_.add(Verb::post, "/api/kernels/{id}/move", [this](Call& c) {
    json body = c.req.body().empty() ? json::object() : http::parse_json(c.req.body());
    if (!body.is_object() || (body.contains("to") && !body["to"].is_string())) {
      return c.fail(make_error(ErrorCode::kInvalidArgument, "bad_request",
                               "the body is {\"to\": \"<node tag>\"} or empty"));
    }
    if (options_.node.move_key.empty()) {
      return c.fail(moves_off());
    }
    offload(
        [this, req = c.req, id = c.param("id"), to = body.value("to", "")]() {
          std::vector<Session> sessions;
          {
            MutexLock lock(sessions_mu_);
            for (const auto& [sid, s] : sessions_) {
              if (s.kernel_id == id) {
                sessions.push_back(s);
              }
            }
          }
          std::string tag;
          auto moved =
              registry_.move_out(id, [&](const kernels::MovedKernel& m) -> Result<std::string> {
                CELLGATE_ASSIGN_OR_RETURN(tag, send_kernel(m, to, sessions));
                return "node " + tag;
              });
          if (!moved) {
            return error_response(req, moved.error());
          }
          json ids = json::array();
          {
            MutexLock lock(sessions_mu_);
            for (const auto& s : sessions) {
              sessions_.erase(s.id);
              protocol::note_moved(s.id, "node " + tag);
              ids.push_back(s.id);
            }
          }
          return json_response(req, Status::ok, json{{"id", id}, {"node", tag}, {"sessions", ids}});
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });

  router_.add(Verb::post, "/api/node/imports", [this](Call& c) {
    if (options_.node.move_key.empty() || imports_->dir().empty()) {
      return c.fail(moves_off());
    }
    json body = http::parse_json(c.req.body());
    if (!body.is_object() || !body.contains("manifest") || !body["manifest"].is_object() ||
        !body.contains("signature") || !body["signature"].is_string()) {
      return c.fail(make_error(ErrorCode::kInvalidArgument, "bad_request",
                               "the body is {\"manifest\": {...}, \"signature\": \"<hex>\"}"));
    }
    const json& m = body["manifest"];
    if (!move_signer(options_.node.move_key)
             .verify(body["signature"].get<std::string>(), m.dump(), "", "", "")) {
      spdlog::warn("a kernel archive's manifest with a bad signature was refused");
      return c.fail(make_error(ErrorCode::kPermissionDenied, "bad_move_signature",
                               "the manifest is not signed with this cluster's move key"));
    }
    // Signed by a peer: its fields are ours to trust for what they are, not their types.
    try {
      if (m.at("v").get<int>() != 1 || m.at("to").get<std::string>() != node_tag_) {
        return c.fail(make_error(ErrorCode::kInvalidArgument, "move_not_for_us",
                                 "the manifest names another node than " + node_tag_));
      }
      if (m.at("expires").get<std::int64_t>() < unix_now()) {
        return c.fail(
            make_error(ErrorCode::kPermissionDenied, "move_expired", "the manifest expired"));
      }
      const auto bytes = m.at("bytes").get<std::uint64_t>();
      (void)m.at("sha256").get<std::string>();
      (void)m.at("kernel_id").get<std::string>();
      (void)m.at("kernel_name").get<std::string>();
      (void)m.at("key").get<std::string>();
      (void)m.at("env").get<std::map<std::string, std::string>>();
      (void)m.at("sessions").get<json::array_t>();
      struct statvfs fs {};
      if (::statvfs(options_.state_dir.c_str(), &fs) == 0 &&
          static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize < bytes * 2) {
        return c.fail(make_error(ErrorCode::kResourceExhausted, "no_space",
                                 "no room for the kernel's archive and its image here"));
      }
    } catch (const json::exception&) {
      return c.fail(make_error(ErrorCode::kInvalidArgument, "bad_request",
                               "the manifest lacks a field or has one of the wrong type"));
    }
    auto iid = imports_->open(m);
    if (!iid) {
      return c.fail(iid.error());
    }
    c.reply(http::json_response(c.req, Status::created, json{{"import", *iid}}));
  });

  router_.add(Verb::put, "/api/node/imports/{iid}", [this](Call& c) {
    const std::string iid = c.param("iid");
    auto off = c.target.query.find("offset");
    std::uint64_t offset = 0;
    if (off == c.target.query.end() ||
        std::sscanf(off->second.c_str(), "%llu", reinterpret_cast<unsigned long long*>(&offset)) !=
            1) {
      return c.fail(
          make_error(ErrorCode::kInvalidArgument, "bad_request", "?offset=N is required"));
    }
    auto im = imports_->take(iid);
    if (!im) {
      return c.fail(im.error());
    }
    Imports::Import& import = **im;
    const std::string& data = c.req.body();
    const auto bytes = import.manifest.value("bytes", std::uint64_t{0});
    Result<void> done = [&]() -> Result<void> {
      if (offset != import.received) {
        return make_error(ErrorCode::kInvalidArgument, "bad_offset",
                          "the next part begins at " + std::to_string(import.received));
      }
      if (import.received + data.size() > bytes) {
        return make_error(ErrorCode::kInvalidArgument, "too_long",
                          "the archive is longer than its manifest says");
      }
      std::ofstream out(import.path, std::ios::binary | std::ios::app);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      out.flush();
      if (!out) {
        return make_error(ErrorCode::kInternal, "io_error", "the archive could not be written");
      }
      import.received += data.size();
      return {};
    }();
    const std::uint64_t received = import.received;
    imports_->give_back(iid);
    if (!done) {
      imports_->close(iid);  // a part out of order or too long: the upload starts again
      return c.fail(done.error());
    }
    c.reply(http::json_response(c.req, Status::ok, json{{"received", received}}));
  });

  router_.add(Verb::post, "/api/node/imports/{iid}/restore", [this](Call& c) {
    const std::string iid = c.param("iid");
    auto im = imports_->take(iid);
    if (!im) {
      return c.fail(im.error());
    }
    offload(
        [this, req = c.req, iid, import = *im]() {
          const json m = import->manifest;  // a copy: close() below ends the import
          Result<kernels::KernelModel> model = [&]() -> Result<kernels::KernelModel> {
            if (import->received != m.value("bytes", std::uint64_t{0}) ||
                file_sha256(import->path) != m.value("sha256", "")) {
              spdlog::warn(
                  "kernel {}: an archive that is not the one its manifest signed was "
                  "refused",
                  m.value("kernel_id", ""));
              return make_error(ErrorCode::kPermissionDenied, "bad_move_archive",
                                "the archive is not the one its manifest signed (size or "
                                "SHA-256)");
            }
            // move_in removes the archive; the import ends below either way.
            kernels::MovedKernel moved{
                m.value("kernel_id", ""), m.value("kernel_name", ""), m.value("key", ""),
                m.at("env").get<std::map<std::string, std::string>>(), import->path};
            return registry_.move_in(moved);
          }();
          imports_->close(iid);
          if (!model) {
            return error_response(req, model.error());
          }
          json sessions = json::array();
          {
            MutexLock lock(sessions_mu_);
            for (const auto& s : m.at("sessions")) {
              if (!s.is_object() || !s.contains("id") || !s["id"].is_string()) {
                continue;
              }
              Session session{s["id"].get<std::string>(), s.value("path", ""), s.value("name", ""),
                              s.value("type", ""), model->id};
              if (sessions_.emplace(session.id, session).second) {
                sessions.push_back(session_model(session));
              }
            }
          }
          return json_response(req, Status::created,
                               json{{"kernel", model->to_json()}, {"sessions", sessions}});
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
}

}  // namespace cellgate::api
