#include "tcp_link.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "reduce.h"
#include "tcp_socket.h"

namespace hora {
namespace {

// No more than this many bytes per send()/recv() call, so that progress on
// one large message does not starve the other peers.
constexpr std::size_t kMaxBytesPerCall = 1 << 20;

// A reducing receive lands in a staging buffer of this size and is reduced
// from there, a cache-sized piece at a time.
constexpr std::size_t kStagingBytes = 64 * 1024;

bool would_block() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

}  // namespace

// Receives into the staging buffer and reduces every whole element that has
// arrived; a partial element waits at the front of staging for its rest.
// Returns what recv() returned.
std::size_t TcpLink::receive_reducing(int fd, Operation& op) {
  if (staging_.empty()) staging_.resize(kStagingBytes);
  const std::size_t element = element_size(op.dtype);
  const std::size_t want = std::min(op.remaining - staged_, kStagingBytes - staged_);
  const ssize_t n = ::recv(fd, staging_.data() + staged_, want, MSG_DONTWAIT);
  if (n <= 0) return static_cast<std::size_t>(n);  // the caller tells 0 (closed) and -1 (errno) apart
  const std::size_t have = staged_ + static_cast<std::size_t>(n);
  const std::size_t whole = have - have % element;
  reduce_into(op.data, staging_.data(), whole / element, op.dtype, op.op, op.factor, op.own);
  staged_ = have - whole;
  if (staged_) std::memmove(staging_.data(), staging_.data() + whole, staged_);
  op.data += whole;
  if (op.own != nullptr) op.own += whole;
  op.remaining -= whole;
  return static_cast<std::size_t>(n);
}

bool TcpLink::progress(int fd, LinkQueues& queues) {
  bool moved = false;
  while (!queues.sends.empty()) {
    Operation& op = queues.sends.front();
    if (op.remaining > 0) {
      const ssize_t n = ::send(fd, op.data, std::min(op.remaining, kMaxBytesPerCall), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (would_block()) break;
        throw LinkLost(" while sending: " + errno_text(errno));
      }
      op.data += n;
      op.remaining -= static_cast<std::size_t>(n);
      moved = true;
    }
    if (op.remaining > 0) break;
    queues.sends.pop_front();
    ++queues.sends_done;
    moved = true;
  }
  while (!queues.recvs.empty()) {
    Operation& op = queues.recvs.front();
    if (op.remaining > 0) {
      ssize_t n;
      if (op.reduce) {
        n = static_cast<ssize_t>(receive_reducing(fd, op));
      } else {
        n = ::recv(fd, op.data, std::min(op.remaining, kMaxBytesPerCall), MSG_DONTWAIT);
        if (n > 0) {
          op.data += n;
          op.remaining -= static_cast<std::size_t>(n);
        }
      }
      if (n == 0) throw LinkLost(": connection closed by the peer");
      if (n < 0) {
        if (would_block()) break;
        throw LinkLost(" while receiving: " + errno_text(errno));
      }
      moved = true;
    }
    if (op.remaining > 0) break;
    queues.recvs.pop_front();
    ++queues.recvs_done;
    moved = true;
  }
  return moved;
}

}  // namespace hora
