// Alltoall and barrier: the collectives that talk to every peer directly
// rather than around the ring.
#include <cstring>
#include <stdexcept>
#include <string>

#include "collectives.h"
#include "segments.h"

namespace hora {

// Every send and receive is posted at once; the transport progresses them
// together, so no pair waits on another.
void alltoall(Transport& transport, const void* input, const std::vector<std::size_t>& send_bytes, void* output,
              const std::vector<std::size_t>& recv_bytes) {
  const int size = transport.size();
  const int rank = transport.rank();
  if (send_bytes.size() != static_cast<std::size_t>(size) || recv_bytes.size() != static_cast<std::size_t>(size)) {
    throw std::invalid_argument("alltoall needs one split per rank: got " + std::to_string(send_bytes.size()) +
                                " send and " + std::to_string(recv_bytes.size()) + " receive splits for a world of size " +
                                std::to_string(size) + ".");
  }
  const std::vector<std::size_t> send_offsets = block_offsets(send_bytes);
  const std::vector<std::size_t> recv_offsets = block_offsets(recv_bytes);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);

  if (send_bytes[rank] != recv_bytes[rank]) {
    throw std::invalid_argument("alltoall: rank " + std::to_string(rank) + " sends " +
                                std::to_string(send_bytes[rank]) + " bytes to itself but expects " +
                                std::to_string(recv_bytes[rank]) + ".");
  }
  std::vector<Handle> handles;
  for (int distance = 1; distance < size; ++distance) {
    const int source = ring_index(rank - distance, size);
    handles.push_back(transport.recv(source, out + recv_offsets[source], recv_bytes[source]));
  }
  for (int distance = 1; distance < size; ++distance) {
    const int destination = ring_index(rank + distance, size);
    handles.push_back(transport.send(destination, in + send_offsets[destination], send_bytes[destination]));
  }
  if (send_bytes[rank] > 0) std::memmove(out + recv_offsets[rank], in + send_offsets[rank], send_bytes[rank]);
  for (const Handle& handle : handles) transport.wait(handle);
}

// Dissemination barrier: in round k each rank signals rank + 2^k and waits
// for rank - 2^k; after ceil(log2(size)) rounds every rank has heard,
// directly or through others, from every other rank.
void barrier(Transport& transport) {
  const int size = transport.size();
  const int rank = transport.rank();
  char token_out = 1;
  char token_in = 0;
  for (int distance = 1; distance < size; distance *= 2) {
    const Handle received = transport.recv(ring_index(rank - distance, size), &token_in, 1);
    const Handle sent = transport.send(ring_index(rank + distance, size), &token_out, 1);
    transport.wait(received);
    transport.wait(sent);
  }
}

}  // namespace hora
