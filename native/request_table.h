// Every rank's outstanding requests, kept identically on every rank. It decides when a
// request is ready (every member of its process set has submitted it, or
// joined), checks that the members agree on it, fuses ready tensors, and
// notices stalls. A tensor every member announced from the response cache in
// one cycle comes in agreed already (add_agreed). It only computes; the
// engine moves the messages.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

#include "process_sets.h"
#include "request.h"

namespace hora {

class RequestTable {
 public:
  using Clock = std::chrono::steady_clock;

  RequestTable(int world_size, std::size_t fusion_threshold_bytes);

  void set_fusion_threshold(std::size_t bytes) { fusion_threshold_ = bytes; }

  // Records `request` from global rank `rank`.
  void add(int rank, Request request, Clock::time_point now);

  // Records `response`, a single tensor's, that every member of its process
  // set agreed on without the table (they all announced the response
  // cache's entry for it this cycle): it goes out with this cycle's ready
  // responses, fused and grouped as theirs are, ahead of them. Returns
  // false, having done nothing, when the table must decide (a rank has
  // joined, or the tensor waits here already).
  bool add_agreed(const Response& response);

  // The responses that are ready, in execution order: failures, then
  // collectives fused up to the threshold. `sets` is the process set table
  // as of this cycle.
  std::vector<Response> take_ready(const ProcessSets& sets);

  // Lines describing tensors that some ranks submitted more than `after`
  // ago and others have not; each tensor is reported at most once per
  // `after`. Empty when nothing is stalled.
  std::string stall_report(Clock::time_point now, std::chrono::milliseconds after, const ProcessSets& sets);

  // The oldest waiting tensor's description when it has waited more than
  // `after`, else empty.
  std::string stalled_longer_than(Clock::time_point now, std::chrono::milliseconds after,
                                  const ProcessSets& sets) const;

  // The earliest time at which stall_report could report something new.
  std::optional<Clock::time_point> next_stall_check(std::chrono::milliseconds after) const;

 private:
  struct Pending {
    std::vector<std::optional<Request>> by_rank;  // indexed by global rank
    int count = 0;
    Clock::time_point first_seen;
    Clock::time_point last_reported;
  };

  std::optional<Response> check_and_build(const std::vector<int>& members, const Pending& pending,
                                          const std::vector<int>& joined_absent) const;
  std::vector<Response> fuse(std::vector<Response> ready) const;
  std::string describe_waiting(const Pending& pending, Clock::time_point now, const ProcessSets& sets) const;

  int world_size_;
  std::size_t fusion_threshold_;
  std::unordered_map<std::string, Pending> pending_;  // key: "<set>:<name>"; arrival_order_ orders it
  std::vector<std::string> arrival_order_;
  std::vector<Response> agreed_;  // add_agreed(), in the order added
  std::map<std::string, std::vector<Response>> groups_;  // ready members of incomplete groups
  std::vector<int> joined_;                              // in join order
  std::set<int> shutting_down_;
};

}  // namespace hora
