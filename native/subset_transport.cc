#include "subset_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hora {

SubsetTransport::SubsetTransport(Transport& base, std::vector<int> members) : base_(base), members_(std::move(members)) {
  const auto found = std::find(members_.begin(), members_.end(), base.rank());
  if (found == members_.end()) {
    throw std::invalid_argument("rank " + std::to_string(base.rank()) + " is not a member of this process set.");
  }
  rank_ = static_cast<int>(found - members_.begin());
}

int SubsetTransport::global(int peer) const {
  if (peer < 0 || peer >= size()) {
    throw std::invalid_argument("peer " + std::to_string(peer) + " is outside a process set of size " +
                                std::to_string(size()) + ".");
  }
  return members_[peer];
}

Handle SubsetTransport::send(int peer, const void* data, std::size_t bytes) {
  return base_.send(global(peer), data, bytes);
}

Handle SubsetTransport::recv(int peer, void* data, std::size_t bytes) {
  return base_.recv(global(peer), data, bytes);
}

Handle SubsetTransport::recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op,
                                    double factor, const void* own) {
  return base_.recv_reduce(global(peer), data, bytes, dtype, op, factor, own);
}

bool SubsetTransport::incoming(int peer) { return base_.incoming(global(peer)); }

void SubsetTransport::wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  std::vector<int> globals;
  for (int peer : peers) globals.push_back(global(peer));
  base_.wait_incoming(globals, timeout);
}

}  // namespace hora
