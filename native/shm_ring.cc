#include "shm_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "reduce.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hora {
namespace {

// Bytes moved per call before the counter is published, so that the reader
// starts on a chunk while the writer copies the next.
constexpr std::size_t kChunkBytes = 64 * 1024;
// Streaming full chunks past the writer's cache.
//
// A store to a ring line that the reader's core holds must first take the
// line from that core. Usually that costs little, but on this house's 2-core
// AMD VMs it is bimodal and sticky: in a quarter to a half of the 2-rank
// launches, for the whole launch and for some message sizes, the writer's
// copies into the ring ran at 2.3-3.7 GB/s instead of 11-13 GB/s (the
// reader's side stayed fast), and allreduces took 4-9x longer (64 MiB: 45-69
// ms instead of 10-14; 1 MiB: 0.6-0.7 ms instead of 0.08-0.12). The same
// happens to a bare two-process ring outside Hora in the machine's slow
// phases. Non-temporal stores never fetch the line, and did not slow down in
// any launch, but they cost the reader a trip to memory: always streaming
// made every launch of 64 MiB take 13-18 ms (1 MiB: 0.12-0.21).
//
// So each writer times its full chunks both ways, smoothed, and streams only
// while copying through the cache costs more than twice as much as
// streaming: the slow mode, which that ratio tells apart at once (4x and
// more, against about 1x). One chunk in kProbeEvery goes the other way to
// keep both figures current, since the mode can change within a launch.
constexpr uint32_t kProbeEvery = 32;
constexpr double kStreamWhenCachedCostsTimes = 2.0;

// memcpy with non-temporal stores. Streaming stores need 16-byte aligned
// destinations: a message starts 64-byte aligned, but a reader that consumed
// part of a chunk can leave the next one anywhere, so the bytes up to the
// first 64-byte boundary are copied normally.
void copy_streaming(char* destination, const char* source, std::size_t bytes) {
  std::size_t i = std::min<std::size_t>(bytes, (64 - reinterpret_cast<std::uintptr_t>(destination) % 64) % 64);
  std::memcpy(destination, source, i);
#if defined(__SSE2__)
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 48), d);
  }
  _mm_sfence();  // the stores are weakly ordered: they complete before the head is published
#endif
  if (i < bytes) std::memcpy(destination + i, source + i, bytes - i);
}

static_assert(kRingBytes % kMessageAlign == 0, "messages must not straddle the end of the ring");

uint64_t align_up(uint64_t position) { return (position + kMessageAlign - 1) / kMessageAlign * kMessageAlign; }

}  // namespace

std::size_t ByteRing::write(const char* source, std::size_t bytes, bool* wake_peer) {
  const uint64_t tail = control_->tail.load(std::memory_order_acquire);
  if (position_ >= tail + kRingBytes) return 0;
  const std::size_t offset = position_ % kRingBytes;
  const std::size_t n = std::min({bytes, static_cast<std::size_t>(tail + kRingBytes - position_),
                                  kRingBytes - offset, kChunkBytes});
  if (n == kChunkBytes) {
    const bool stream = stream_next_chunk();
    const auto start = std::chrono::steady_clock::now();
    if (stream) {
      copy_streaming(data_ + offset, source, n);
    } else {
      std::memcpy(data_ + offset, source, n);
    }
    record_chunk(stream, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
  } else {
    std::memcpy(data_ + offset, source, n);
  }
  position_ += n;
  // Sequentially consistent with the reader's sleep_as_reader(): either the
  // reader sees the new head before sleeping, or this side sees its flag.
  control_->head.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->reader_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->reader_asleep.exchange(0) != 0;
  return n;
}

std::size_t ByteRing::read(char* target, std::size_t bytes, bool reduce, DataType dtype, ReduceOp op, double factor,
                           const char* own, bool* wake_peer) {
  const uint64_t head = control_->head.load(std::memory_order_acquire);
  if (head <= position_) return 0;
  const std::size_t offset = position_ % kRingBytes;
  std::size_t n = std::min({bytes, static_cast<std::size_t>(head - position_), kRingBytes - offset, kChunkBytes});
  if (reduce) {
    const std::size_t element = element_size(dtype);
    n -= n % element;
    if (n == 0) return 0;
    reduce_into(target, data_ + offset, n / element, dtype, op, factor, own);
  } else {
    std::memcpy(target, data_ + offset, n);
  }
  position_ += n;
  control_->tail.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->writer_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->writer_asleep.exchange(0) != 0;
  return n;
}

void ByteRing::end_message() { position_ = align_up(position_); }

bool ByteRing::put(const void* record, std::size_t bytes, bool* wake_peer) {
  if (position_ + bytes > control_->tail.load(std::memory_order_acquire) + kRingBytes) return false;
  std::memcpy(data_ + position_ % kRingBytes, record, bytes);
  position_ += bytes;
  control_->head.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->reader_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->reader_asleep.exchange(0) != 0;
  return true;
}

const void* ByteRing::peek(std::size_t bytes) const {
  if (control_->head.load(std::memory_order_acquire) < position_ + bytes) return nullptr;
  return data_ + position_ % kRingBytes;
}

void ByteRing::consume(std::size_t bytes, bool* wake_peer) {
  position_ += bytes;
  control_->tail.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->writer_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->writer_asleep.exchange(0) != 0;
}

bool ByteRing::stream_next_chunk() {
  const double cached = chunk_nanoseconds_[0];
  const double streamed = chunk_nanoseconds_[1];
  if (cached == 0) return false;  // measure both first
  if (streamed == 0) return true;
  const bool faster = cached > kStreamWhenCachedCostsTimes * streamed;
  return ++chunks_ % kProbeEvery == 0 ? !faster : faster;
}

void ByteRing::record_chunk(bool streamed, double nanoseconds) {
  double& smoothed = chunk_nanoseconds_[streamed ? 1 : 0];
  // A copy interrupted by the scheduler (milliseconds on a busy 2-core host)
  // says nothing about the caches: one sample moves the estimate at most 4x.
  if (smoothed > 0) nanoseconds = std::min(nanoseconds, 4 * smoothed);
  smoothed = smoothed == 0 ? nanoseconds : smoothed + (nanoseconds - smoothed) / 8;
}

bool ByteRing::sleep_as_reader() {
  control_->reader_asleep.store(1, std::memory_order_seq_cst);
  if (control_->head.load(std::memory_order_seq_cst) > position_) {
    control_->reader_asleep.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool ByteRing::sleep_as_writer(uint64_t tail) {
  control_->writer_asleep.store(1, std::memory_order_seq_cst);
  if (control_->tail.load(std::memory_order_seq_cst) >= tail) {
    control_->writer_asleep.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

}  // namespace hora
