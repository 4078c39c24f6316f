// Ids that carry the node that minted them (docs/scale-out.md): UUID-shaped, version 4 and its
// variant bits kept (jupyter_server's `\w+-\w+-\w+-\w+-\w+` and UUID parsers accept them), with
// the first 8 hex digits replaced by this gateway's node tag (4) and boot epoch (4):
//
//   0003a71c-5e2b-4f10-9c3d-7be01f2a9c44     node 3, epoch a71c, ~90 random bits
//
// A router sends a request to the id's node on its first 4 digits alone (HAProxy's map_beg), so
// no catalog is on the path. The epoch tells an id of this node's earlier life (its kernels lost
// with it) from a live one: such an id is "node-restarted" (HTTP 410), not unknown (404).
//
//   protocol::set_node(3, epoch);          // once, before any id is minted (cellgate serve)
//   std::string id = protocol::new_node_id();
//   if (protocol::from_lost_boot(id)) { … 410 … }
//
// Without set_node() (tests, tools), new_node_id() is a plain random UUID and nothing is lost.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::protocol {

struct NodeStamp {
  std::uint16_t tag = 0;
  std::uint16_t epoch = 0;
  // The 8 hex digits ids begin with: "0003a71c".
  std::string prefix() const;
};

// Sets the stamp new ids carry. Call before threads mint ids (it is read without a lock after).
void set_node(std::uint16_t tag, std::uint16_t epoch);
std::optional<NodeStamp> node();

// A random UUID; stamped with the node when set_node() was called.
std::string new_node_id();
// The same without dashes (32 hex digits), for ids that never had them (snapshots, MCP).
std::string new_node_hex_id();

// The stamp an id carries in its first 8 hex digits; nullopt when it does not start with them.
std::optional<NodeStamp> stamp_of(std::string_view id);

// True when `id` carries this node's tag and another epoch: minted by an earlier boot of this
// node, whose kernels (and sessions, sandboxes) are gone. False without set_node().
bool from_lost_boot(std::string_view id);

// Remembers that `id` (a kernel's, a session's) moved from this node to the node `where` names
// (kernels' move_out, "node 0002"); the last 4096 are kept.
void note_moved(const std::string& id, const std::string& where);

// What a lookup of `id` that found nothing should answer: kUnavailable "kernel_moved" (503) for
// an id that moved away (until the routers send it to its new node), kNotFound with
// "node-restarted" (HTTP 410 Gone: http::status_for) for an id of a lost boot, else `not_found`
// as it is.
Error unknown_id(std::string_view id, Error not_found);

}  // namespace cellgate::protocol
