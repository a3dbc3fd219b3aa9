// Recursive doubling (as in MPICH's short-message allreduce).
//
// With n a power of two: in step k (mask = 2^k) each rank exchanges its
// whole partial result with the rank whose number differs in bit k, and
// both combine the two. After log2(n) steps every rank has combined all n
// contributions. With n = p + r, p the largest power of two not above n,
// the first 2r ranks pair up first: each even one hands its buffer to the
// odd one above it and sits out, the p remaining ranks run the steps above,
// and each odd rank hands the result back to its even partner.
//
// Both ranks of a pair combine the same two partial results in the same
// order, the lower rank's first: min and max are not commutative bit for
// bit (NaN, and the sign of zero), and every rank must end with the same
// bits. By induction, the members of each group that has combined its
// contributions hold identical bits.
#include "recursive_doubling.h"

#include <cstring>
#include <vector>

#include "reduce.h"

namespace hora {
namespace {

// Combines `mine` with `theirs` (from `peer`) into `mine`, lower rank first.
void combine(char* mine, char* theirs, std::size_t count, DataType dtype, ReduceOp op, int rank, int peer) {
  if (peer < rank) {
    reduce_into(theirs, mine, count, dtype, op);
    std::memcpy(mine, theirs, count * element_size(dtype));
  } else {
    reduce_into(mine, theirs, count, dtype, op);
  }
}

}  // namespace

void recursive_doubling_allreduce(Transport& transport, char* data, std::size_t count, DataType dtype,
                                  ReduceOp op) {
  const int size = transport.size();
  const int rank = transport.rank();
  if (size == 1 || count == 0) return;
  const std::size_t bytes = count * element_size(dtype);
  std::vector<char> received(bytes);
  auto exchange = [&](int peer) {
    const Handle send = transport.send(peer, data, bytes);
    const Handle recv = transport.recv(peer, received.data(), bytes);
    transport.wait(recv);
    transport.wait(send);  // before `data` changes
    combine(data, received.data(), count, dtype, op, rank, peer);
  };

  int power = 1;
  while (power * 2 <= size) power *= 2;
  const int extra = size - power;
  // The rank's number among the `power` ranks that run the steps, or -1.
  int member = rank - extra;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      transport.wait(transport.send(rank + 1, data, bytes));
      transport.wait(transport.recv(rank + 1, data, bytes));
      return;
    }
    transport.wait(transport.recv(rank - 1, received.data(), bytes));
    combine(data, received.data(), count, dtype, op, rank, rank - 1);
    member = rank / 2;
  }
  for (int mask = 1; mask < power; mask <<= 1) {
    const int partner = member ^ mask;
    exchange(partner < extra ? partner * 2 + 1 : partner + extra);
  }
  if (rank < 2 * extra) transport.wait(transport.send(rank - 1, data, bytes));
}

}  // namespace hora
