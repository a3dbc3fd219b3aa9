// One direction of a shared-memory pair (shm_link.h): a single-producer,
// single-consumer byte ring in the pair's segment (shm_segment.h).
//
// Each ring is a byte stream with the same message semantics as TCP (see
// transport.h): the writer copies bytes in and publishes `head`, the reader
// copies or reduces them out and publishes `tail`. Every message starts at a
// kMessageAlign boundary of the stream, so an element of any data type never
// straddles the end of the ring and a reducing read can work on the ring's
// memory directly. The ring does no waiting of its own (see shm_link.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dtypes.h"

namespace hora {

// Data bytes per direction: small enough to stay in cache between the
// writer's copy and the reader's pass, large enough for a few segments in flight.
constexpr std::size_t kRingBytes = std::size_t{1} << 20;
constexpr std::size_t kMessageAlign = 64;

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
  // Copies (or, when `reduce`, reduces into `target`, times `factor`, with
  // `own` as the left operand when it is not null: reduce.h) up to `bytes`
  // bytes out; returns how many (0 when nothing has arrived). A reducing
  // read moves whole elements only.
  std::size_t read(char* target, std::size_t bytes, bool reduce, DataType dtype, ReduceOp op, double factor,
                   const char* own, bool* wake_peer);
  // Ends the current message on this side: the next one starts at an aligned position.
  void end_message();

  // Single copy (shm_link.h). The writer puts a record of `bytes` bytes in
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
  // past it (see shm_ring.cc). Decided by timing both, per ring.
  bool stream_next_chunk();
  void record_chunk(bool streamed, double nanoseconds);

  RingControl* control_;
  char* data_;
  uint64_t position_ = 0;  // this side's stream position (head for a writer, tail for a reader)
  double chunk_nanoseconds_[2] = {0.0, 0.0};  // smoothed cost of a full chunk [cached, streamed]; 0: unmeasured
  uint32_t chunks_ = 0;
};

}  // namespace hora
