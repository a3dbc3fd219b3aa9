// Executes agreed responses on this rank: packs fused tensors into the
// fusion buffer, runs one collective over the response's process set, and
// unpacks the results. A rank that has joined takes part with the identity
// of the op (or no rows) in place of a tensor of its own.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "request.h"
#include "subset_transport.h"
#include "timeline.h"
#include "transport.h"

namespace hora {

// A request as submitted on this rank, with its buffer. The submission owns
// the buffer through `owner` until it is destroyed (after the collective ran,
// or when the engine fails or shuts down), so the memory stays valid whatever
// the caller does with its handle meanwhile. Submissions are destroyed on
// whichever thread runs the engine at that moment; `owner`'s deleter must be
// safe to run on any of them.
struct Submission {
  Request request;
  std::string key;                 // "<process set>:<name>", set by the engine
  // allreduce, broadcast: in place (an allreduce out of place: the result); others: the input (read only).
  void* buffer = nullptr;
  const void* input = nullptr;  // allreduce out of place: the tensor (read only, not overlapping `buffer`)
  std::shared_ptr<const void> owner;
  std::vector<int64_t> splits;     // alltoall: rows sent to each member
  std::chrono::steady_clock::time_point submitted;
  int64_t handle = -1;
};

// What a completed request hands back. In-place operations have no output.
struct Result {
  std::shared_ptr<std::vector<char>> output;
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;  // alltoall
  int value = -1;                        // join: the last rank to join; add_process_set: the new id
};

class Executor {
 public:
  Executor(Transport& transport, Timeline& timeline) : transport_(transport), timeline_(timeline) {}

  // Runs `response` among `members` (global ranks, including this one).
  // `local[i]` is this rank's submission for tensor i, or nullptr when this
  // rank joined instead. Leaves one result per tensor in `results`.
  void execute(const Response& response, const std::vector<const Submission*>& local,
               const std::vector<int>& members, std::vector<Result>& results);

  // From now on, allreduce over the whole job runs hierarchically: within
  // `host` (the ranks of this host), then across `cross` (the ranks with
  // this rank's local rank). See hierarchical_allreduce().
  void use_hierarchy(std::vector<int> host, std::vector<int> cross);
  bool hierarchical() const { return host_ != nullptr; }
  // Whether allreduce over the whole job uses the hierarchy (when there is one).
  void enable_hierarchy(bool enabled) { hierarchy_enabled_ = enabled; }

 private:
  struct Context;
  void allreduce(Context& context);
  void allgather(Context& context);
  void broadcast(Context& context);
  void alltoall(Context& context);
  void reducescatter(Context& context);
  char* fusion_buffer(std::size_t bytes);
  // `count` elements of `data` converted to the accumulation type `to`, in
  // a buffer of the executor's (see accumulation_type in reduce.h).
  char* widen(const char* data, DataType from, DataType to, std::size_t count);
  void span_begin(const Context& context, const char* activity);
  void span_end(const Context& context);

  Transport& transport_;
  Timeline& timeline_;
  std::unique_ptr<SubsetTransport> host_;
  bool hierarchy_enabled_ = true;
  std::unique_ptr<SubsetTransport> cross_;
  std::vector<char> fusion_;
  std::vector<char> widened_;
  std::vector<std::size_t> offsets_;  // allreduce: where each tensor starts, in elements (reused)
};

}  // namespace hora
