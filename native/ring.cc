// Ring reduce-scatter and allgather, and the collectives built from them.
//
// The buffer is cut into `size` blocks; block b ends up owned by rank b. The
// ranks form a ring in which rank r sends to r+1 and receives from r-1.
//
// Reduce-scatter: in step s (0 .. size-2) rank r sends block r-s-1 and
// receives block r-s-2, which it reduces into its own copy. The block
// received in step s is the block sent in step s+1, so each block travels
// once around the ring, picking up every rank's contribution, and after
// size-1 steps rank r holds the full reduction of block r.
//
// Allgather: rank r starts with its finished block r. In step s it sends
// block r-s and receives block r-s-1 straight into place.
//
// Each block moves in segments (segments.h). A received segment is reduced
// into place by the transport as it arrives (recv_reduce) and is forwarded
// to the right as soon as it is reduced, so consecutive steps overlap
// instead of waiting for whole blocks. Ring allreduce = reduce-scatter + allgather: every rank sends and
// receives 2(size-1)/size of the buffer, the bandwidth optimum. In an
// allreduce the two phases are one pipeline: each segment of a rank's own
// block goes to the right the moment its reduction is complete, as the
// allgather's first step, so the allgather streams while the reduce-scatter
// still runs and sends each segment while it is still in cache (as NCCL's
// ring does), instead of starting when the whole reduce-scatter is done and
// reading the block back from memory.
#include "ring.h"

#include <cstring>
#include <stdexcept>

#include "collectives.h"
#include "recursive_doubling.h"
#include "reduce.h"
#include "segments.h"

namespace hora {
namespace {

// Applies the parts of the result that come after the sum: the division of
// Average and the postscale factor.
void finish_reduction(void* block, std::size_t count, DataType dtype, ReduceOp op, double postscale, int size) {
  if (op == ReduceOp::kAverage) {
    if (is_floating(dtype)) {
      scale(block, count, dtype, postscale / size);
      return;
    }
    divide_integers(block, count, dtype, size);
  }
  scale(block, count, dtype, postscale);
}

void check_counts(const Transport& transport, const std::vector<std::size_t>& counts, const char* what) {
  if (counts.size() != static_cast<std::size_t>(transport.size())) {
    throw std::invalid_argument(std::string(what) + " needs one count per rank: got " +
                                std::to_string(counts.size()) + " counts for a world of size " +
                                std::to_string(transport.size()) + ".");
  }
}

// The finish of a block whose reduction is already final (see reduce_scatter_steps).
constexpr auto kNothingToFinish = [](char*, std::size_t) {};

std::vector<std::size_t> in_bytes(const std::vector<std::size_t>& counts, std::size_t element_bytes) {
  std::vector<std::size_t> bytes(counts);
  for (std::size_t& b : bytes) b *= element_bytes;
  return bytes;
}

void wait_all(Transport& transport, const std::vector<Handle>& handles) {
  for (const Handle& handle : handles) transport.wait(handle);
}

// ring_reduce_scatter without the final wait: its sends are appended to
// `sends`. `finish(segment, count)` runs on each segment of this rank's own
// block as soon as the segment's reduction is complete; with `send_own` the
// finished segment then goes to the right at once, the first step of the
// allgather that follows (allgather_steps with `own_sent`).
template <typename Finish>
void reduce_scatter_steps(Transport& transport, char* data, const std::vector<std::size_t>& counts, DataType dtype,
                          ReduceOp op, double factor, const char* source, Finish finish, bool send_own,
                          std::vector<Handle>& sends) {
  const int size = transport.size();
  const int rank = transport.rank();
  const std::size_t element_bytes = element_size(dtype);
  const std::vector<std::size_t> offsets = block_offsets(counts);
  auto block_data = [&](int block) { return data + offsets[block] * element_bytes; };
  auto block_bytes = [&](int block) { return counts[block] * element_bytes; };
  // This rank's contribution to a block, read once: by its first send or by the reduction into `data`.
  auto own_data = [&](int block) { return (source ? source : data) + offsets[block] * element_bytes; };
  if (size == 1) {
    if (source != nullptr && block_bytes(rank)) std::memcpy(block_data(rank), own_data(rank), block_bytes(rank));
    scale(block_data(rank), counts[rank], dtype, factor);
    finish(block_data(rank), counts[rank]);
    return;
  }
  const int right = ring_index(rank + 1, size);
  const int left = ring_index(rank - 1, size);
  const WorkingSet working_set(transport, offsets.back() * element_bytes);

  const int first_block = ring_index(rank - 1, size);
  for (const Segment& segment : split_segments(block_bytes(first_block), element_bytes)) {
    sends.push_back(transport.send(right, own_data(first_block) + segment.offset, segment.bytes));
  }
  for (int step = 0; step < size - 1; ++step) {
    const int block = ring_index(rank - step - 2, size);
    char* into = block_data(block);
    const char* own = source ? own_data(block) : nullptr;
    const bool last = step == size - 2;  // this rank's own block, which the step completes
    const auto reduce = [&](const Segment& segment) {
      return transport.recv_reduce(left, into + segment.offset, segment.bytes, dtype, op, last ? factor : 1.0,
                                   own ? own + segment.offset : nullptr);
    };
    const auto arrived = [&](const Segment& segment) {
      if (last) finish(into + segment.offset, segment.bytes / element_bytes);
    };
    receive_and_forward(transport, into, split_segments(block_bytes(block), element_bytes), reduce,
                        !last || send_own ? right : -1, sends, arrived);
  }
}

// ring_allgather without the final wait: its sends are appended to `sends`.
// Blocks move in segments of whole `unit`s; with `own_sent` this rank's
// block has already gone to the right (reduce_scatter_steps' `send_own`, in
// segments of the same unit).
void allgather_steps(Transport& transport, char* data, const std::vector<std::size_t>& byte_counts, std::size_t unit,
                     bool own_sent, std::vector<Handle>& sends) {
  const int size = transport.size();
  const int rank = transport.rank();
  if (size == 1) return;
  const std::vector<std::size_t> offsets = block_offsets(byte_counts);
  const int right = ring_index(rank + 1, size);
  const int left = ring_index(rank - 1, size);
  const WorkingSet working_set(transport, offsets.back());

  if (!own_sent) {
    for (const Segment& segment : split_segments(byte_counts[rank], unit)) {
      sends.push_back(transport.send(right, data + offsets[rank] + segment.offset, segment.bytes));
    }
  }
  for (int step = 0; step < size - 1; ++step) {
    const int block = ring_index(rank - step - 1, size);
    char* into = data + offsets[block];
    const auto copy = [&](const Segment& segment) { return transport.recv(left, into + segment.offset, segment.bytes); };
    receive_and_forward(transport, into, split_segments(byte_counts[block], unit), copy, step < size - 2 ? right : -1,
                        sends);
  }
}

// reduce_scatter_steps, each segment of this rank's own block finished as it
// is completed: for a floating-point type the finish is one factor, which the
// last reduction of each element applies in the same pass over memory
// (recv_reduce, transport.h); integers divide exactly, in a pass of their own
// over the segment while it is in cache. `divisor` is what an Average divides by.
void reduce_scatter_and_finish(Transport& transport, char* data, const std::vector<std::size_t>& counts,
                               DataType dtype, ReduceOp accumulate, ReduceOp op, double postscale, int divisor,
                               const char* source, bool send_own, std::vector<Handle>& sends) {
  if (is_floating(dtype)) {
    const double factor = op == ReduceOp::kAverage ? postscale / divisor : postscale;
    reduce_scatter_steps(transport, data, counts, dtype, accumulate, factor, source, kNothingToFinish,
                         send_own, sends);
    return;
  }
  const auto finish = [&](char* segment, std::size_t count) {
    finish_reduction(segment, count, dtype, op, postscale, divisor);
  };
  reduce_scatter_steps(transport, data, counts, dtype, accumulate, 1.0, source, finish, send_own, sends);
}

// The ring allreduce of `data` cut into `counts` blocks: reduce-scatter and
// allgather as one pipeline (see the top of this file).
void ring_allreduce(Transport& transport, char* data, const std::vector<std::size_t>& counts, DataType dtype,
                    ReduceOp accumulate, ReduceOp op, double postscale, int divisor, const char* source) {
  const std::size_t element_bytes = element_size(dtype);
  std::vector<Handle> sends;
  reduce_scatter_and_finish(transport, data, counts, dtype, accumulate, op, postscale, divisor, source,
                            /*send_own=*/true, sends);
  allgather_steps(transport, data, in_bytes(counts, element_bytes), element_bytes, /*own_sent=*/true, sends);
  wait_all(transport, sends);
}

}  // namespace

void ring_reduce_scatter(Transport& transport, char* data, const std::vector<std::size_t>& counts, DataType dtype,
                         ReduceOp op, double factor, const char* source) {
  std::vector<Handle> sends;
  reduce_scatter_steps(transport, data, counts, dtype, op, factor, source, kNothingToFinish,
                       /*send_own=*/false, sends);
  wait_all(transport, sends);
}

void ring_allgather(Transport& transport, char* data, const std::vector<std::size_t>& byte_counts) {
  std::vector<Handle> sends;
  allgather_steps(transport, data, byte_counts, 1, /*own_sent=*/false, sends);
  wait_all(transport, sends);
}

void allreduce(Transport& transport, void* buffer, std::size_t count, DataType dtype, ReduceOp op, double prescale,
               double postscale) {
  allreduce(transport, buffer, buffer, count, dtype, op, prescale, postscale);
}

void allreduce(Transport& transport, const void* input, void* output, std::size_t count, DataType dtype, ReduceOp op,
               double prescale, double postscale) {
  check_reduction(dtype, op);
  const int size = transport.size();
  const std::size_t element_bytes = element_size(dtype);
  char* data = static_cast<char*>(output);
  const char* source = static_cast<const char*>(input);
  const bool by_ring = size > 1 && count * element_bytes > kRecursiveDoublingBytes;
  // Only the ring reads its input in place of a copy; the rest (and a prescale) work on `output`.
  if (source != data && (!by_ring || prescale != 1.0)) {
    if (count) std::memcpy(data, source, count * element_bytes);
    source = data;
  }
  scale(data, count, dtype, prescale);
  if (!by_ring) {
    recursive_doubling_allreduce(transport, data, count, dtype, op);
    finish_reduction(data, count, dtype, op, postscale, size);
    return;
  }
  ring_allreduce(transport, data, even_split(count, size), dtype, op, op, postscale, size,
                 source == data ? nullptr : source);
}

void hierarchical_allreduce(Transport& local, Transport& cross, void* buffer, std::size_t count, DataType dtype,
                            ReduceOp op, double prescale, double postscale) {
  check_reduction(dtype, op);
  const int world = local.size() * cross.size();
  const std::size_t element_bytes = element_size(dtype);
  char* data = static_cast<char*>(buffer);
  const std::vector<std::size_t> counts = even_split(count, local.size());
  const std::vector<std::size_t> offsets = block_offsets(counts);
  char* share = data + offsets[local.rank()] * element_bytes;
  const std::size_t share_count = counts[local.rank()];
  // Average is a sum until the end, where it divides by the whole job.
  const ReduceOp accumulate = op == ReduceOp::kAverage ? ReduceOp::kSum : op;

  scale(data, count, dtype, prescale);
  ring_reduce_scatter(local, data, counts, dtype, accumulate);
  ring_allreduce(cross, share, even_split(share_count, cross.size()), dtype, accumulate, op, postscale, world, nullptr);
  ring_allgather(local, data, in_bytes(counts, element_bytes));
}

void reducescatter(Transport& transport, void* buffer, const std::vector<std::size_t>& counts, DataType dtype,
                   ReduceOp op, double prescale, double postscale) {
  check_reduction(dtype, op);
  check_counts(transport, counts, "reducescatter");
  char* data = static_cast<char*>(buffer);
  scale(data, block_offsets(counts).back(), dtype, prescale);
  std::vector<Handle> sends;
  reduce_scatter_and_finish(transport, data, counts, dtype, op, op, postscale, transport.size(), nullptr,
                            /*send_own=*/false, sends);
  wait_all(transport, sends);
}

void allgather(Transport& transport, const void* input, void* output, const std::vector<std::size_t>& byte_counts) {
  check_counts(transport, byte_counts, "allgather");
  const int rank = transport.rank();
  const std::vector<std::size_t> offsets = block_offsets(byte_counts);
  char* data = static_cast<char*>(output);
  if (byte_counts[rank] > 0 && data + offsets[rank] != input) {
    std::memmove(data + offsets[rank], input, byte_counts[rank]);
  }
  ring_allgather(transport, data, byte_counts);
}

}  // namespace hora
