// Shared memory between two ranks of one host: a pair of single-producer,
// single-consumer byte rings in one anonymous segment (memfd), one ring per
// direction.
//
// The segment has no name in any file system: the lower rank creates it with
// memfd_create() and hands the descriptor to the higher rank over a
// short-lived abstract Unix socket (SCM_RIGHTS). Nothing is left behind when
// either process exits, however it exits, because the kernel frees the
// memory with the last mapping. The abstract socket lives only during set-up
// and is authenticated with a random token sent over the pair's
// already-authenticated TCP connection.
//
// Each ring is a byte stream with the same message semantics as TCP (see
// transport.h): the writer copies bytes in and publishes `head`, the reader
// copies or reduces them out and publishes `tail`. Every message starts at a
// kMessageAlign boundary of the stream, so an element of any data type never
// straddles the end of the ring and a reducing read can work on the ring's
// memory directly. The ring does no waiting of its own; the transport spins
// on it briefly and then sleeps in poll() on the pair's TCP connection, over
// which the other side rings a one-byte doorbell when it sees the sleeper's
// flag (see mesh_transport.cc).
//
// Single copy. Through the ring, every byte of a large message is copied
// twice, into the ring by the writer and out of it by the reader, each pass
// on a core the framework also computes on. Where the kernel lets one rank
// read the other's memory (process_vm_readv, "cross-memory attach"; the set-up
// tries it in both directions), a message of kSingleCopyBytes or more crosses
// by reference instead: the writer puts a descriptor (its buffer's address
// and size) in the ring, the reader copies or reduces straight out of the
// writer's buffer, and only then consumes the descriptor, which tells the
// writer its buffer is free again (the send completes). A reducing read goes
// through a small scratch buffer that stays in the reader's cache. Both sides
// decide by the message's size alone, which they agree on (transport.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "dtypes.h"
#include "link_queues.h"
#include "tcp_socket.h"

namespace hora {

// Data bytes per direction: small enough to stay in cache between the
// writer's copy and the reader's pass, large enough for a few segments in flight.
constexpr std::size_t kRingBytes = std::size_t{1} << 20;
constexpr std::size_t kMessageAlign = 64;
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

// The shared control block of one direction; each counter has its own cache line.
struct RingControl {
  alignas(64) std::atomic<uint64_t> head{0};  // stream bytes published by the writer
  alignas(64) std::atomic<uint64_t> tail{0};  // stream bytes released by the reader
  alignas(64) std::atomic<uint32_t> reader_asleep{0};
  alignas(64) std::atomic<uint32_t> writer_asleep{0};
  // Set by the writer when its transport aborts: a buffer it passed by
  // reference may be freed or reused from then on, so what the reader
  // copied from it may be garbage.
  alignas(64) std::atomic<uint32_t> abandoned{0};
};

// One direction as seen from one side: the writer side of the outgoing ring
// or the reader side of the incoming one.
class ByteRing {
 public:
  ByteRing(RingControl* control, char* data) : control_(control), data_(data) {}

  // Copies up to `bytes` bytes in; returns how many fit (0 when full).
  // Sets *wake_peer when the reader was asleep and must be woken.
  std::size_t write(const char* source, std::size_t bytes, bool* wake_peer);
  // Copies (or, when `reduce`, reduces into `target`) up to `bytes` bytes out;
  // returns how many (0 when nothing has arrived). A reducing read moves whole elements only.
  std::size_t read(char* target, std::size_t bytes, bool reduce, DataType dtype, ReduceOp op, bool* wake_peer);
  // Ends the current message on this side: the next one starts at an aligned position.
  void end_message();

  // Single copy (see above). The writer puts a record of `bytes` bytes in
  // whole, or nothing when it does not fit; the reader looks at the record
  // at its position once it has arrived whole (null before), and consumes it
  // when done with it, publishing its position (*wake_peer as for read()).
  bool put(const void* record, std::size_t bytes, bool* wake_peer);
  const void* peek(std::size_t bytes) const;
  void consume(std::size_t bytes, bool* wake_peer);
  // This side's stream position, and whether the reader has consumed up to `position`.
  uint64_t position() const { return position_; }
  bool released(uint64_t position) const { return control_->tail.load(std::memory_order_acquire) >= position; }

  bool readable() const { return control_->head.load(std::memory_order_acquire) > position_; }
  bool writable() const { return position_ < control_->tail.load(std::memory_order_acquire) + kRingBytes; }

  // Announces that this side is about to sleep and returns whether it still
  // must: false when the peer moved in the meantime. The flag is cleared by
  // the peer when it rings, or by this side once awake.
  bool sleep_as_reader();
  // A writer sleeps until the reader's position reaches `tail`: room in the
  // ring, or a message passed by reference released.
  bool sleep_as_writer(uint64_t tail);
  // The reader's position at which this writer has room for `bytes` more.
  uint64_t tail_for_room(std::size_t bytes) const {
    return position_ + bytes <= kRingBytes ? 0 : position_ + bytes - kRingBytes;
  }
  // The writer gives up on its messages (see RingControl::abandoned); the reader asks.
  void abandon() { control_->abandoned.store(1, std::memory_order_seq_cst); }
  bool abandoned() const { return control_->abandoned.load(std::memory_order_seq_cst) != 0; }
  void awake_as_reader() { control_->reader_asleep.store(0, std::memory_order_relaxed); }
  void awake_as_writer() { control_->writer_asleep.store(0, std::memory_order_relaxed); }

 private:
  // How the writer copies a full chunk in: through its cache, or streamed
  // past it (see shm_link.cc). Decided by timing both, per ring.
  bool stream_next_chunk();
  void record_chunk(bool streamed, double nanoseconds);

  RingControl* control_;
  char* data_;
  uint64_t position_ = 0;  // this side's stream position (head for a writer, tail for a reader)
  double chunk_nanoseconds_[2] = {0.0, 0.0};  // smoothed cost of a full chunk [cached, streamed]; 0: unmeasured
  uint32_t chunks_ = 0;
};

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
bool agree_single_copy(int tcp_fd, ShmSegment& segment, bool creator, bool wanted, bool only_peer,
                       Clock::time_point deadline);

}  // namespace hora
