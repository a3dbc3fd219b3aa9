#include "loopback_transport.h"

#include <cstring>
#include <stdexcept>

#include "errors.h"
#include "reduce.h"

namespace hora {

LoopbackGroup::LoopbackGroup(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), queues_(static_cast<std::size_t>(size) * size), woken_(size, 0) {
  if (size < 1) throw std::invalid_argument("LoopbackGroup size must be at least 1, got " + std::to_string(size) + ".");
}

std::shared_ptr<LoopbackTransport> LoopbackGroup::transport(int rank) {
  if (rank < 0 || rank >= size_) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside the loopback group of size " +
                                std::to_string(size_) + ".");
  }
  return std::make_shared<LoopbackTransport>(shared_from_this(), rank);
}

void LoopbackGroup::throw_if_aborted() const {
  if (!abort_reason_.empty()) throw HoraInternalError(abort_reason_);
}

void LoopbackGroup::push(int src, int dst, const void* data, std::size_t bytes) {
  std::vector<char> message(bytes);
  if (bytes) std::memcpy(message.data(), data, bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_aborted();
    queues_[static_cast<std::size_t>(src) * size_ + dst].push_back(std::move(message));
  }
  cv_.notify_all();
}

std::vector<char> LoopbackGroup::pop(int src, int dst) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& queue = queues_[static_cast<std::size_t>(src) * size_ + dst];
  const bool ready = cv_.wait_for(lock, timeout_, [&] { return !queue.empty() || !abort_reason_.empty(); });
  throw_if_aborted();
  if (!ready) {
    const std::string reason = "Rank " + std::to_string(dst) + " timed out after " +
                               std::to_string(timeout_.count()) + " ms waiting for a message from rank " +
                               std::to_string(src) + " (loopback transport).";
    abort_reason_ = reason;
    cv_.notify_all();
    throw HoraInternalError(reason);
  }
  std::vector<char> message = std::move(queue.front());
  queue.pop_front();
  return message;
}

void LoopbackGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  cv_.notify_all();
}

bool LoopbackGroup::has_message(int src, int dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  return !queues_[static_cast<std::size_t>(src) * size_ + dst].empty() || !abort_reason_.empty();
}

void LoopbackGroup::wait_any(int dst, const std::vector<int>& sources, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] {
    if (woken_[dst] || !abort_reason_.empty()) return true;
    for (int src : sources) {
      if (!queues_[static_cast<std::size_t>(src) * size_ + dst].empty()) return true;
    }
    return false;
  });
  woken_[dst] = 0;
}

void LoopbackGroup::wake(int dst) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_[dst] = 1;
  }
  cv_.notify_all();
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackGroup> group, int rank)
    : group_(std::move(group)),
      rank_(rank),
      sends_started_(group_->size(), 0),
      recvs_started_(group_->size(), 0),
      recvs_done_(group_->size(), 0),
      pending_recvs_(group_->size()) {}

int LoopbackTransport::size() const { return group_->size(); }

std::chrono::milliseconds LoopbackTransport::timeout() const { return group_->timeout(); }

void LoopbackTransport::check_peer(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    throw std::invalid_argument("rank " + std::to_string(rank_) + " cannot exchange messages with peer " +
                                std::to_string(peer) + " in a group of size " + std::to_string(size()) + ".");
  }
}

Handle LoopbackTransport::send(int peer, const void* data, std::size_t bytes) {
  check_peer(peer);
  // Sends are buffered: the message is copied into the peer's queue now.
  group_->push(rank_, peer, data, bytes);
  return Handle{peer, true, sends_started_[peer]++};
}

Handle LoopbackTransport::recv(int peer, void* data, std::size_t bytes) {
  check_peer(peer);
  pending_recvs_[peer].push_back(PendingRecv{data, bytes, false, DataType::kUInt8, ReduceOp::kSum, 1.0, nullptr});
  return Handle{peer, false, recvs_started_[peer]++};
}

Handle LoopbackTransport::recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op,
                                      double factor, const void* own) {
  check_peer(peer);
  pending_recvs_[peer].push_back(PendingRecv{data, bytes, true, dtype, op, factor, own});
  return Handle{peer, false, recvs_started_[peer]++};
}

void LoopbackTransport::wait(const Handle& handle) {
  if (handle.is_send) return;  // already delivered to the queue
  auto& pending = pending_recvs_[handle.peer];
  while (recvs_done_[handle.peer] <= handle.sequence) {
    std::vector<char> message = group_->pop(handle.peer, rank_);
    const PendingRecv target = pending.front();
    pending.pop_front();
    if (message.size() != target.bytes) {
      const std::string reason = "Rank " + std::to_string(rank_) + " expected a message of " +
                                 std::to_string(target.bytes) + " bytes from rank " + std::to_string(handle.peer) +
                                 " but received " + std::to_string(message.size()) + " bytes.";
      group_->abort(reason);
      throw HoraInternalError(reason);
    }
    if (target.reduce) {
      reduce_into(target.data, message.data(), target.bytes / element_size(target.dtype), target.dtype, target.op,
                  target.factor, target.own);
    } else if (target.bytes) {
      std::memcpy(target.data, message.data(), target.bytes);
    }
    ++recvs_done_[handle.peer];
  }
}

void LoopbackTransport::abort(const std::string& reason) { group_->abort(reason); }

bool LoopbackTransport::incoming(int peer) {
  check_peer(peer);
  return pending_recvs_[peer].empty() && group_->has_message(peer, rank_);
}

void LoopbackTransport::wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  group_->wait_any(rank_, peers, timeout);
}

void LoopbackTransport::wake() { group_->wake(rank_); }

}  // namespace hora
