// The transport interface: ordered, reliable byte messages between the ranks
// of one job. Collectives are written against this interface only; they never
// see sockets or shared memory.
//
// Semantics, which every implementation keeps:
//  * send(), recv() and recv_reduce() start an operation and return a handle
//    at once. The caller's buffer must stay valid (and, for send, unchanged)
//    until wait() on that handle returns.
//  * recv_reduce() receives a message like recv() but reduces it into the
//    destination (dst[i] = (dst[i] op message[i]) * factor) instead of
//    overwriting it: a collective's last reduction of an element also
//    applies what comes after the sum (the division of Average, a
//    postscale factor) in the same pass over memory. With `own`, the
//    receive reduces that buffer with the message into `data` instead
//    (dst[i] = (own[i] op message[i]) * factor), so that a collective can
//    leave its input untouched without copying it first; `own` must stay
//    valid and unchanged until wait() returns, and not overlap `data`.
//    A transport reduces straight out of its own buffers where it can, so
//    a reducing receive is one pass over memory, not a copy and a pass.
//  * Between one ordered pair of ranks, sends complete in the order they were
//    started, and the k-th message sent is received by the k-th recv posted by
//    the peer. The sizes of matching send and recv are equal.
//  * wait() drives progress of every pending operation, not only the one
//    waited on, so an algorithm may post sends and receives to several peers
//    and wait for them in any order without deadlocking.
//  * No operation waits forever: if no byte moves for timeout() the wait
//    throws HoraInternalError. A peer that closes or dies makes the waits
//    involving it throw HoraInternalError, and the transport is then broken:
//    every later call throws at once with the original cause.
//  * A ring or broadcast collective names the size of the buffer its messages
//    come from and go to with set_working_set() before it starts them, the
//    same size on every rank (WorkingSet below); the others leave it 0, and
//    a message's own size decides. It is a hint: a transport may choose how
//    to move a message by it, as the shared-memory link does (shm_link.h),
//    and then decides when the operation starts, so both sides decide alike.
//  * An idle engine waits for the next message with wait_incoming(), which
//    sleeps without a timeout error and returns early when another thread
//    calls wake(). wake() is the only method that may be called from a
//    thread other than the one using the transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtypes.h"

namespace hora {

// Identifies one started operation: the k-th send to, or receive from, peer.
struct Handle {
  int peer = -1;
  bool is_send = false;
  uint64_t sequence = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Handle send(int peer, const void* data, std::size_t bytes) = 0;
  virtual Handle recv(int peer, void* data, std::size_t bytes) = 0;
  virtual Handle recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op, double factor,
                             const void* own) = 0;
  virtual void wait(const Handle& handle) = 0;

  // Fails every pending and later operation with `reason` and tells the peers
  // (by closing connections) so that they fail quickly too.
  virtual void abort(const std::string& reason) = 0;

  virtual std::chrono::milliseconds timeout() const = 0;

  // Whether a message from `peer` has begun to arrive (or its connection has
  // failed) while no receive is posted for it. Never blocks.
  virtual bool incoming(int peer) = 0;

  // Blocks until incoming(p) holds for one of `peers`, wake() is called, or
  // `timeout` passes, whichever is first. Never throws on timeout.
  virtual void wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) = 0;

  // Makes the current or the next wait_incoming() return at once.
  virtual void wake() = 0;

  // The bytes of the buffer that operations started from now on belong to
  // (0: unknown, the default). Transports that do not use it ignore it.
  virtual void set_working_set(std::size_t bytes) { (void)bytes; }
  virtual std::size_t working_set() const { return 0; }
};

// Names a collective's buffer for its duration and restores the previous
// working set afterwards (0 outside collectives), also when it throws.
class WorkingSet {
 public:
  WorkingSet(Transport& transport, std::size_t bytes) : transport_(transport), previous_(transport.working_set()) {
    transport_.set_working_set(bytes);
  }
  ~WorkingSet() { transport_.set_working_set(previous_); }
  WorkingSet(const WorkingSet&) = delete;
  WorkingSet& operator=(const WorkingSet&) = delete;

 private:
  Transport& transport_;
  std::size_t previous_;
};

}  // namespace hora
