// Shared memory between two ranks of one host: a pair of byte rings
// (shm_ring.h) in one anonymous segment (shm_segment.h), one ring per
// direction, which carry a transport link's messages (link_queues.h). The
// ring does no waiting of its own; the transport spins on it briefly and then
// sleeps in poll() on the pair's TCP connection, over which the other side
// rings a one-byte doorbell when it sees the sleeper's flag (see
// mesh_transport.cc).
//
// Single copy. Through the ring, every byte of a large message is copied
// twice, into the ring by the writer and out of it by the reader, each pass
// on a core the framework also computes on. Where the kernel lets one rank
// read the other's memory (process_vm_readv, "cross-memory attach"; the set-up
// tries it in both directions), a message of kSingleCopyBytes or more crosses
// by reference instead: the writer puts a reference (its buffer's address
// and size) in the ring, the reader copies or reduces straight out of the
// writer's buffer, and only then consumes the reference, which tells the
// writer its buffer is free again (the send completes). A reducing read goes
// through a small scratch buffer that stays in the reader's cache. Both sides
// decide by the message's size alone, which they agree on (transport.h).
#pragma once

#include <cstddef>
#include <memory>

#include "link_queues.h"
#include "shm_ring.h"
#include "shm_segment.h"

namespace hora {

// Messages at least this large cross by reference where single copy works.
// Small messages sit in the caches, where two user-space copies beat the
// kernel's page-by-page one plus the reference's round trip (bench/peers.py,
// 2 ranks, with 64 KiB here: 64 KiB and 1 MiB allreduces took 1.2-1.5x
// longer; 16 MiB ones half as long). The ring algorithms send segments of
// at most 256 KiB (segments.h), so only whole segments go by reference: a
// 64 KiB allreduce does not, a 1 MiB one still does (and takes up to 1.35x
// as long as through the ring), and a smaller segment size there would
// turn single copy off.
constexpr std::size_t kSingleCopyBytes = 256 * 1024;

// A peer on this host: its operations move through the pair's two rings;
// the pair's TCP connection only carries doorbells (mesh_transport.cc).
class ShmLink {
 public:
  // `single_copy`: pass large messages by reference (agree_single_copy()).
  ShmLink(std::unique_ptr<ShmSegment> segment, bool creator, bool single_copy);

  // Moves bytes of the front operations of `queues` until the outgoing ring
  // is full and the incoming one empty; returns whether anything moved. Sets
  // *wake_peer when the peer sleeps and must be rung.
  bool progress(LinkQueues& queues, bool* wake_peer);
  // Announces that this side is about to sleep until `queues` can move, and
  // returns whether it still must (false: the peer moved meanwhile).
  bool sleep(const LinkQueues& queues);
  // Announces a sleep until a message arrives (nothing posted yet).
  bool sleep_until_readable() { return in_.sleep_as_reader(); }
  // Clears this side's sleep flags (the peer's flags stay).
  void awake() {
    in_.awake_as_reader();
    out_.awake_as_writer();
  }
  bool readable() const { return in_.readable(); }
  bool single_copy() const { return single_copy_; }
  // Tells the peer that buffers passed by reference are no longer valid (the transport aborts).
  void abandon() { out_.abandon(); }

 private:
  bool by_reference(const Operation& op) const { return single_copy_ && op.bytes >= kSingleCopyBytes; }
  bool progress_sends(LinkQueues& queues, bool* wake);
  std::size_t read_by_reference(Operation& op, bool* wake);
  void check_not_abandoned() const;

  std::unique_ptr<ShmSegment> segment_;
  ByteRing out_;
  ByteRing in_;
  bool single_copy_;
  std::unique_ptr<char[]> scratch_;  // a reducing read's chunk of the peer's buffer
};

}  // namespace hora
