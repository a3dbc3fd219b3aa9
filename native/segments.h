// Splits a block of a buffer into pipeline segments. Sender and receiver
// compute the same split from the same block size, which keeps message
// boundaries in agreement on every transport.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "transport.h"

namespace hora {

// Bytes per pipeline segment: large enough that per-message overhead is
// small, small enough that the next segment is on the wire while this one
// is reduced.
constexpr std::size_t kSegmentBytes = 256 * 1024;

struct Segment {
  std::size_t offset;  // bytes from the start of the block
  std::size_t bytes;
};

// Splits `block_bytes` into segments of at most kSegmentBytes whose sizes
// are multiples of `element_bytes`.
inline std::vector<Segment> split_segments(std::size_t block_bytes, std::size_t element_bytes) {
  std::vector<Segment> segments;
  const std::size_t step = std::max<std::size_t>(element_bytes, kSegmentBytes / element_bytes * element_bytes);
  for (std::size_t offset = 0; offset < block_bytes; offset += step) {
    segments.push_back(Segment{offset, std::min(step, block_bytes - offset)});
  }
  return segments;
}

// Element offsets of back-to-back blocks.
inline std::vector<std::size_t> block_offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

inline int ring_index(long long value, int size) {
  return static_cast<int>(((value % size) + size) % size);
}

// `count` split into `parts` shares that differ by at most one, the larger
// first: how every collective divides a buffer (or rows) among ranks.
template <typename Count>
std::vector<Count> even_split(Count count, int parts) {
  std::vector<Count> shares(parts, count / parts);
  for (Count i = 0; i < count % parts; ++i) ++shares[i];
  return shares;
}

// The pipeline step of the ring and the broadcast chain: posts every
// segment's receive at once (`receive(segment)` posts one and returns its
// handle), and as each arrives runs `arrived(segment)` on it and forwards it
// from `block` to `to` unless `to` is negative, appending those sends to
// `sends`. Segments are forwarded the moment they land, so consecutive steps
// overlap.
template <typename Receive, typename Arrived>
void receive_and_forward(Transport& transport, const char* block, const std::vector<Segment>& segments,
                         Receive receive, int to, std::vector<Handle>& sends, Arrived arrived) {
  std::vector<Handle> recvs;
  recvs.reserve(segments.size());
  for (const Segment& segment : segments) recvs.push_back(receive(segment));
  for (std::size_t k = 0; k < segments.size(); ++k) {
    transport.wait(recvs[k]);
    arrived(segments[k]);
    if (to >= 0) sends.push_back(transport.send(to, block + segments[k].offset, segments[k].bytes));
  }
}

template <typename Receive>
void receive_and_forward(Transport& transport, const char* block, const std::vector<Segment>& segments,
                         Receive receive, int to, std::vector<Handle>& sends) {
  receive_and_forward(transport, block, segments, receive, to, sends, [](const Segment&) {});
}

}  // namespace hora
