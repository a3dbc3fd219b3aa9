// Broadcast as a pipelined chain. Ranks are ordered by distance from the
// root; each receives the buffer segment by segment from its predecessor and
// forwards every segment as soon as it arrives, so for large buffers the
// time is close to one transfer of the buffer whatever the world size.
#include <stdexcept>
#include <string>

#include "collectives.h"
#include "segments.h"

namespace hora {

void broadcast(Transport& transport, void* buffer, std::size_t bytes, int root) {
  const int size = transport.size();
  const int rank = transport.rank();
  if (root < 0 || root >= size) {
    throw std::invalid_argument("broadcast root rank " + std::to_string(root) + " is outside the world of size " +
                                std::to_string(size) + "; expected 0 <= root < " + std::to_string(size) + ".");
  }
  if (size == 1) return;
  char* data = static_cast<char*>(buffer);
  const int position = ring_index(rank - root, size);
  const int next = ring_index(rank + 1, size);
  const int previous = ring_index(rank - 1, size);
  const std::vector<Segment> segments = split_segments(bytes, 1);
  const WorkingSet working_set(transport, bytes);

  std::vector<Handle> sends;
  if (position == 0) {
    for (const Segment& segment : segments) sends.push_back(transport.send(next, data + segment.offset, segment.bytes));
  } else {
    const auto copy = [&](const Segment& segment) {
      return transport.recv(previous, data + segment.offset, segment.bytes);
    };
    receive_and_forward(transport, data, segments, copy, position < size - 1 ? next : -1, sends);
  }
  for (const Handle& handle : sends) transport.wait(handle);
}

}  // namespace hora
