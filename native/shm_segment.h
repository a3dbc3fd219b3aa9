// The memory a same-host pair shares, and how the pair sets it up.
//
// The segment has no name in any file system: the lower rank creates it with
// memfd_create() and hands the descriptor to the higher rank over a
// short-lived abstract Unix socket (SCM_RIGHTS). Nothing is left behind when
// either process exits, however it exits, because the kernel frees the
// memory with the last mapping. The abstract socket lives only during set-up
// and is authenticated with a random token sent over the pair's
// already-authenticated TCP connection.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "shm_ring.h"
#include "tcp_socket.h"

namespace hora {

// The mapped segment of one pair: two control blocks and two rings.
class ShmSegment {
 public:
  // Creates and maps a fresh segment; throws HoraInternalError if the system refuses.
  static std::unique_ptr<ShmSegment> create();
  // Maps a segment received from the peer; takes ownership of `fd`.
  static std::unique_ptr<ShmSegment> map(int fd);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int fd() const { return fd_; }
  // The peer's process, as the kernel reported it at set-up (0: unknown).
  pid_t peer_pid() const { return peer_pid_; }
  void set_peer_pid(pid_t pid) { peer_pid_ = pid; }

  // Where each side says what the peer should find at which address of its memory.
  struct Probe {
    std::atomic<uint64_t> address{0};
    std::atomic<uint64_t> value{0};
  };
  Probe* probe(bool creator) const;
  const uint64_t& probe_value() const { return probe_value_; }
  // The ring this side writes and the ring it reads; the creator writes ring 0.
  ByteRing outgoing(bool creator);
  ByteRing incoming(bool creator);

 private:
  ShmSegment(int fd, void* base);
  RingControl* control(int direction) const;
  char* data(int direction) const;

  int fd_;
  void* base_;
  pid_t peer_pid_ = 0;
  uint64_t probe_value_;  // what the peer must read from this process (agree_single_copy())
};

// Set-up over the pair's authenticated TCP connection `tcp_fd`. Both sides
// of every same-host pair call one of these, the lower rank offer_segment()
// and the higher accept_segment(), even when shared memory is turned off on
// either side: each says whether it wants shared memory, and the pair uses it
// only if both do and it works. Returns the segment, or null for TCP.
std::unique_ptr<ShmSegment> offer_segment(int tcp_fd, bool wanted, Clock::time_point deadline);
std::unique_ptr<ShmSegment> accept_segment(int tcp_fd, bool wanted, Clock::time_point deadline);

// Then both sides of a pair that shares `segment` call this: each publishes a
// value in its own memory, reads the peer's with process_vm_readv, and the
// pair passes large messages by reference only if both reads worked and
// both sides want it (a kernel or container may forbid the call).
// `only_peer`: the peer is this rank's only one on the host, so under Yama's
// ptrace_scope=1 this process may name it as the one allowed to read it.
// A pair that does also checks that both sides pass by reference from the
// same `buffer_bytes` (ShmLink::may_pass_by_reference), which both must know
// for every message, and fails the set-up naming both values otherwise.
bool agree_single_copy(int tcp_fd, ShmSegment& segment, bool creator, bool wanted, bool only_peer,
                       std::size_t buffer_bytes, Clock::time_point deadline);

}  // namespace hora
