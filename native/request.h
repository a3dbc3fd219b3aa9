// What a rank asks the engine for (a Request) and what the ranks agreed to
// execute (a Response), with their byte encoding. A Request carries
// everything that must match across ranks; the buffers stay with the rank
// that submitted it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtypes.h"
#include "serialize.h"

namespace hora {

enum class RequestKind : uint8_t {
  kAllreduce,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  kJoin,
  kAddProcessSet,
  kRemoveProcessSet,
  kShutdown,
};

std::string to_string(RequestKind kind);

// Whether requests of this kind move tensor data (rather than only
// synchronise, like a barrier or join).
inline bool moves_data(RequestKind kind) { return kind <= RequestKind::kReducescatter; }

struct Request {
  std::string name;
  RequestKind kind = RequestKind::kAllreduce;
  int32_t process_set = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  std::vector<int64_t> shape;
  // Requests of one grouped call share a group name and execute as one unit.
  std::string group;
  int32_t group_size = 0;
  // kAddProcessSet: the members (global ranks); kRemoveProcessSet: {set id}.
  std::vector<int32_t> ranks;
};

// The name under which a request is tracked on a rank, "<process set>:<name>"
// (the same name may be in flight in two process sets), written into `key`,
// reusing its memory (for lookups made every cycle).
inline const std::string& assign_request_key(std::string& key, int32_t process_set, const std::string& name) {
  return key.assign(std::to_string(process_set)).append(1, ':').append(name);
}
inline std::string request_key(int32_t process_set, const std::string& name) {
  std::string key;
  assign_request_key(key, process_set, name);
  return key;
}

void write_request(Writer& out, const Request& request);
Request read_request(Reader& in);

// One tensor of a response. `shape` is the shape every rank agreed on (for
// allgather and alltoall, only the dimensions after the first are agreed).
// For allgather, `first_dims` holds each member's first dimension.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> first_dims;
  // The group the tensor was submitted in (empty: none), so that a cached
  // response answers a group's member only when it comes in that group again.
  std::string group;
  int32_t group_size = 0;

  bool operator==(const TensorEntry& other) const {
    return name == other.name && shape == other.shape && first_dims == other.first_dims && group == other.group &&
           group_size == other.group_size;
  }
};

// A collective to execute, on one tensor or on several fused into one
// buffer, or a failure to report for those tensors on every rank.
struct Response {
  RequestKind kind = RequestKind::kAllreduce;
  int32_t process_set = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  std::vector<TensorEntry> tensors;
  std::string error;             // non-empty: fail these tensors with this message
  std::vector<int32_t> joined;   // global ranks that joined: they contribute the identity of the op
  int32_t last_joined = -1;      // kJoin: the last rank to join
  std::vector<int32_t> ranks;    // kAddProcessSet: the members; kRemoveProcessSet: {set id}
};

// Whether two responses may share a fusion buffer, or a cached response may
// stand for a new one: everything but the tensors must be equal.
bool same_parameters(const Response& a, const Response& b);

// Whether `response`, a plain one (no error, no joined ranks), has the
// parameters of `request`: same_parameters(response, response_for(request))
// without building the response.
bool answers(const Response& response, const Request& request);

// The bytes of the tensors of `response` (for allgather, of every member's rows).
std::size_t response_bytes(const Response& response);

// A response with the parameters of `request` and no tensors yet.
Response response_for(const Request& request);

// The request that `tensor` of `response` answers (for allgather, with the
// agreed shape; the caller sets its own first dimension).
Request request_for(const Response& response, const TensorEntry& tensor);

// "(2, 3)" — shapes in error messages look like numpy's.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace hora
