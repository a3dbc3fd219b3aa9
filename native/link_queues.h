// What a mesh transport (mesh_transport.h) has started on the link to one
// peer: the operations of each direction, in order, and how many finished.
// The two kinds of link, TCP (tcp_link.h) and shared memory (shm_link.h),
// move their bytes; the transport routes, waits and fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <stdexcept>

#include "dtypes.h"

namespace hora {

// One send or receive in progress: `remaining` bytes from or into `data`.
struct Operation {
  char* data;
  std::size_t remaining;
  bool reduce = false;  // a receive that reduces into `data` instead of overwriting it
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  double factor = 1.0;    // a reducing receive's factor on the result (transport.h)
  const char* own = nullptr;  // a reducing receive's left operand when it is not `data` (transport.h)
  std::size_t bytes = 0;  // the whole message's size (`remaining` counts down)
  // Shared memory (shm_link.h): whether a header says how the message
  // crosses (both sides know, from its size, when it starts), whether that
  // header has been written or read, and whether it crosses by reference
  // (a send: the writer's choice; a receive: what its header said).
  bool announced = false;
  bool header_passed = false;
  bool by_reference = false;
};

struct LinkQueues {
  std::deque<Operation> sends;
  std::deque<Operation> recvs;
  // Sends a link has handed over but the peer has not yet finished with:
  // a shared-memory link passes a large message by reference (shm_link.h),
  // and the sender's buffer stays in use until the peer's read position
  // passes each of these stream positions, in order.
  std::deque<uint64_t> awaiting_release;
  uint64_t sends_started = 0;
  uint64_t sends_done = 0;
  uint64_t recvs_started = 0;
  uint64_t recvs_done = 0;
  uint64_t sent_by_reference = 0;  // sends a shared-memory link passed by reference, ever (a diagnostic)

  bool idle() const { return sends.empty() && recvs.empty() && awaiting_release.empty(); }
};

// Thrown by a link whose connection failed or closed; what() completes the
// sentence "Rank r lost its connection to <peer>".
class LinkLost : public std::runtime_error {
 public:
  explicit LinkLost(const std::string& how) : std::runtime_error(how) {}
};

}  // namespace hora
