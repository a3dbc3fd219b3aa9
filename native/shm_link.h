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
// tries it in both directions), a large message of a large buffer may cross
// by reference instead: the writer puts a reference (its buffer's address
// and size) in the ring, the reader copies or reduces straight out of the
// writer's buffer, and only then consumes the reference, which tells the
// writer its buffer is free again (the send completes). A reducing read goes
// through a small scratch buffer that stays in the reader's cache.
//
// Which messages may: both sides decide by the message's size and the
// collective's working set (transport.h), which they agree on, when the
// operation starts. Which do: only the writer knows where its buffer lies,
// and the kernel pins the pages it reads one by one, which on 4 KiB pages
// costs more than the copy saved (huge_pages.h). So each message that may
// cross by reference starts with a header in which the writer says whether
// it does (its buffer is on huge pages, or the kernel cannot tell) or comes
// through the ring after the header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>

#include "link_queues.h"
#include "shm_ring.h"
#include "shm_segment.h"

namespace hora {

// A message crosses by reference when it is at least kSingleCopyBytes and
// the buffer it belongs to (the collective's working set, or the message
// itself when that is unknown) is at least kSingleCopyBufferBytes.
//
// The buffer decides because of the caches. A buffer that fits a core's L2
// (2 MiB here) is copied twice at cache speed (33-38 GB/s) faster than the
// kernel pins the peer's pages and copies once (bench/peers.py, ring copy
// time / single copy time: 0.5 MiB 0.72-0.84, 1 MiB 0.70-0.74). Up to the
// last-level cache's size (32 MiB here) single copy is also the slower way
// in the launches where the ranks' cores seem not to share that cache (a
// rank's memcpy of 16 MiB takes 0.7 ms there instead of 1.3-2: a cache of
// its own; bench/stability.py), as reading the peer's buffer would then
// cross between the caches for every byte. A 16 MiB allreduce from huge
// pages, alternated launches: by reference 2.4-3.2 ms with the cache shared
// and 3.7-6.3 ms without; through the rings 2.0-2.9 ms in both
// (40 launches each way: median 3.18 against 2.42 ms). A 7.4 MB one: 1.32-1.54
// against 1.07-1.37 ms. From 32 MiB the two ways are even in slow phases
// (32 MiB: 5.5-7.0 against 4.9-8.3 ms) and single copy halves a 64 MiB
// allreduce's time in fast ones (5 against 10 ms), its memory passes
// counting most there. (In the quiet phases single copy was built in, it
// was the faster way from 4 MiB: 16 MiB in 1.2-1.7 against 2.3-2.9 ms; the
// worst launches decide here.) The message's own size cannot tell these
// apart: the ring algorithms send segments of 256 KiB (segments.h) whatever
// the buffer.
constexpr std::size_t kSingleCopyBytes = 256 * 1024;
constexpr std::size_t kSingleCopyBufferBytes = 32 * 1024 * 1024;

// A peer on this host: its operations move through the pair's two rings;
// the pair's TCP connection only carries doorbells (mesh_transport.cc).
class ShmLink {
 public:
  // `single_copy`: pass large messages by reference (agree_single_copy()), of
  // buffers from `single_copy_buffer_bytes` (both sides must use the same).
  ShmLink(std::unique_ptr<ShmSegment> segment, bool creator, bool single_copy,
          std::size_t single_copy_buffer_bytes = kSingleCopyBufferBytes);

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
  // Whether a message of `bytes` of a collective over `working_set` bytes
  // (0: unknown) may cross by reference, which both sides know.
  bool may_pass_by_reference(std::size_t bytes, std::size_t working_set) const {
    return single_copy_ && bytes >= kSingleCopyBytes && std::max(bytes, working_set) >= single_copy_buffer_bytes_;
  }
  // Marks an operation this link is about to start: announced by a header
  // when it may cross by reference, and for a send, whether it will.
  void prepare(Operation& op, bool is_send, std::size_t working_set) const;
  // Tells the peer that buffers passed by reference are no longer valid (the transport aborts).
  void abandon() { out_.abandon(); }

 private:
  bool progress_sends(LinkQueues& queues, bool* wake);
  bool read_header(Operation& op, bool* wake);
  std::size_t read_by_reference(Operation& op, bool* wake);
  void check_not_abandoned() const;

  std::unique_ptr<ShmSegment> segment_;
  ByteRing out_;
  ByteRing in_;
  bool single_copy_;
  std::size_t single_copy_buffer_bytes_;
  std::unique_ptr<char[]> scratch_;  // a reducing read's chunk of the peer's buffer
};

}  // namespace hora
