#include "mesh_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "errors.h"
#include "handshake.h"
#include "hmac.h"
#include "reduce.h"
#include "spin.h"

namespace hora {
namespace {

// No more than this many bytes per send()/recv() call, so that progress on
// one large message does not starve the other peers.
constexpr std::size_t kMaxBytesPerCall = 1 << 20;

// A reducing receive over TCP lands in a staging buffer of this size and is
// reduced from there, a cache-sized piece at a time.
constexpr std::size_t kStagingBytes = 64 * 1024;

// How long a connector waits for the acceptor's side of the handshake.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

// The cores this process may run on.
int available_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

MeshTransport::MeshTransport(int rank, const std::vector<PeerAddress>& peers, std::chrono::milliseconds timeout)
    : rank_(rank), timeout_(timeout), peers_(peers.size()) {
  for (std::size_t i = 0; i < peers.size(); ++i) peers_[i].address = peers[i];
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw HoraInternalError("eventfd() failed: " + errno_text(errno));
}

MeshTransport::~MeshTransport() {
  for (Peer& peer : peers_) close_fd(peer.fd);
  close_fd(wake_fd_);
}

std::unique_ptr<MeshTransport> MeshTransport::connect(TcpListener& listener, int rank,
                                                      const std::vector<PeerAddress>& peers,
                                                      const std::vector<int>& hosts, bool shared_memory,
                                                      const std::string& secret,
                                                      std::chrono::milliseconds connect_timeout,
                                                      std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(peers.size());
  if (rank < 0 || rank >= size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a world of " + std::to_string(size) +
                                " peers.");
  }
  if (!hosts.empty() && hosts.size() != peers.size()) {
    throw std::invalid_argument("hosts must name the host of every rank: got " + std::to_string(hosts.size()) +
                                " entries for " + std::to_string(size) + " peers.");
  }
  if (secret.empty()) throw std::invalid_argument("The job secret must not be empty.");
  std::unique_ptr<MeshTransport> transport(new MeshTransport(rank, peers, timeout));
  const Clock::time_point deadline = Clock::now() + connect_timeout;

  // Lower ranks first: a rank only waits on ranks below it, which are (or
  // will soon be) in their accept phase, so the mesh forms without deadlock.
  for (int peer = 0; peer < rank; ++peer) {
    const std::string where = "rank " + std::to_string(peer) + " at " + peers[peer].to_string();
    int fd = -1;
    try {
      fd = connect_to(peers[peer], deadline);
      handshake_as_connector(fd, secret, rank, peer, where, std::min(deadline, Clock::now() + kHandshakeTimeout));
    } catch (const HoraInternalError& error) {
      close_fd(fd);
      throw HoraInternalError("Rank " + std::to_string(rank) + " could not connect to " + where + ": " + error.what());
    }
    transport->peers_[peer].fd = fd;
  }

  const std::vector<int> accepted = accept_peers(listener.fd(), secret, rank, size, deadline);
  std::string missing;
  for (int peer = rank + 1; peer < size; ++peer) {
    transport->peers_[peer].fd = accepted[peer];  // the transport closes them if this fails
    if (accepted[peer] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
  }
  if (!missing.empty()) {
    throw HoraInternalError("Rank " + std::to_string(rank) + " timed out after " + seconds_text(connect_timeout) +
                            " waiting for connections from ranks " + missing + ".");
  }
  if (!hosts.empty()) transport->set_up_shared_memory(hosts, shared_memory, deadline);
  const int local_ranks = hosts.empty() ? 1 : static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[rank]));
  set_cores_per_rank(local_ranks, available_cores());
  return transport;
}

// Pairs are set up in one global order, (lower rank, higher rank)
// ascending, which every rank follows for its own pairs: the first pair not
// yet done always has both its ranks working on it, so set-up cannot deadlock.
void MeshTransport::set_up_shared_memory(const std::vector<int>& hosts, bool wanted, Clock::time_point deadline) {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || hosts[peer] != hosts[rank_]) continue;
    Peer& p = peers_[peer];
    const bool creator = rank_ < peer;
    std::unique_ptr<ShmSegment> segment;
    try {
      segment = creator ? offer_segment(p.fd, wanted, deadline) : accept_segment(p.fd, wanted, deadline);
    } catch (const HoraInternalError& error) {
      throw HoraInternalError("Rank " + std::to_string(rank_) + " could not set up shared memory with " +
                              describe(peer) + ": " + error.what());
    }
    if (segment == nullptr) continue;
    Ring out = segment->outgoing(creator);
    Ring in = segment->incoming(creator);
    p.shm.reset(new Shm{std::move(segment), out, in});
  }
}

std::vector<std::string> MeshTransport::links() const {
  std::vector<std::string> kinds;
  for (int peer = 0; peer < size(); ++peer) {
    kinds.push_back(peer == rank_ ? "self" : peers_[peer].shm ? "shm" : "tcp");
  }
  return kinds;
}

std::string MeshTransport::describe(int peer) const {
  return "rank " + std::to_string(peer) + " (" + peers_[peer].address.to_string() + ")";
}

void MeshTransport::check_usable(int peer) const {
  if (!broken_.empty()) throw HoraInternalError(broken_);
  if (peer < 0 || peer >= size() || peer == rank_) {
    throw std::invalid_argument("rank " + std::to_string(rank_) + " cannot exchange messages with peer " +
                                std::to_string(peer) + " in a world of size " + std::to_string(size()) + ".");
  }
}

Handle MeshTransport::start(int peer, bool is_send, Operation operation) {
  check_usable(peer);
  Peer& p = peers_[peer];
  if (is_send) {
    p.sends.push_back(operation);
    return Handle{peer, true, p.sends_started++};
  }
  p.recvs.push_back(operation);
  return Handle{peer, false, p.recvs_started++};
}

Handle MeshTransport::send(int peer, const void* data, std::size_t bytes) {
  return start(peer, true, Operation{const_cast<char*>(static_cast<const char*>(data)), bytes});
}

Handle MeshTransport::recv(int peer, void* data, std::size_t bytes) {
  return start(peer, false, Operation{static_cast<char*>(data), bytes});
}

Handle MeshTransport::recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op) {
  return start(peer, false, Operation{static_cast<char*>(data), bytes, true, dtype, op});
}

bool MeshTransport::is_done(const Handle& handle) const {
  const Peer& p = peers_[handle.peer];
  return handle.is_send ? p.sends_done > handle.sequence : p.recvs_done > handle.sequence;
}

void MeshTransport::fail_lost(int index, const std::string& how) {
  fail("Rank " + std::to_string(rank_) + " lost its connection to " + describe(index) + how +
       ". The peer process probably exited or crashed.");
}

// Receives into the staging buffer and reduces every whole element that has
// arrived; a partial element waits at the front of staging for its rest.
// Returns the bytes received, or 0 when none were waiting.
std::size_t MeshTransport::receive_reducing(int index, Operation& op) {
  Peer& p = peers_[index];
  if (p.staging.empty()) p.staging.resize(kStagingBytes);
  const std::size_t element = element_size(op.dtype);
  const std::size_t want = std::min(op.remaining - p.staged, kStagingBytes - p.staged);
  const ssize_t n = ::recv(p.fd, p.staging.data() + p.staged, want, MSG_DONTWAIT);
  if (n <= 0) return static_cast<std::size_t>(n);  // the caller tells 0 (closed) and -1 (errno) apart
  const std::size_t have = p.staged + static_cast<std::size_t>(n);
  const std::size_t whole = have - have % element;
  reduce_into(op.data, p.staging.data(), whole / element, op.dtype, op.op);
  p.staged = have - whole;
  if (p.staged) std::memmove(p.staging.data(), p.staging.data() + whole, p.staged);
  op.data += whole;
  op.remaining -= whole;
  return static_cast<std::size_t>(n);
}

// Moves bytes of the front operations of one TCP peer until its socket would
// block; returns whether anything moved.
bool MeshTransport::progress_tcp(int index) {
  Peer& p = peers_[index];
  bool moved = false;
  while (!p.sends.empty()) {
    Operation& op = p.sends.front();
    if (op.remaining > 0) {
      const ssize_t n = ::send(p.fd, op.data, std::min(op.remaining, kMaxBytesPerCall), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail_lost(index, " while sending: " + errno_text(errno));
      }
      op.data += n;
      op.remaining -= static_cast<std::size_t>(n);
      moved = true;
    }
    if (op.remaining > 0) break;
    p.sends.pop_front();
    ++p.sends_done;
    moved = true;
  }
  while (!p.recvs.empty()) {
    Operation& op = p.recvs.front();
    if (op.remaining > 0) {
      ssize_t n;
      if (op.reduce) {
        n = static_cast<ssize_t>(receive_reducing(index, op));
      } else {
        n = ::recv(p.fd, op.data, std::min(op.remaining, kMaxBytesPerCall), MSG_DONTWAIT);
        if (n > 0) {
          op.data += n;
          op.remaining -= static_cast<std::size_t>(n);
        }
      }
      if (n == 0) fail_lost(index, ": connection closed by the peer");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail_lost(index, " while receiving: " + errno_text(errno));
      }
      moved = true;
    }
    if (op.remaining > 0) break;
    p.recvs.pop_front();
    ++p.recvs_done;
    moved = true;
  }
  return moved;
}

namespace {

// Runs `queue`'s operations through one ring while it moves bytes: `transfer`
// moves what it can of the front operation (setting `wake` when the peer must
// be woken); a finished operation ends its ring message and counts in `done`.
template <typename Queue, typename Ring, typename Transfer>
bool drain(Queue& queue, Ring& ring, uint64_t& done, bool& wake, Transfer transfer) {
  bool moved = false;
  while (!queue.empty()) {
    auto& op = queue.front();
    bool woken = false;
    const std::size_t n = op.remaining ? transfer(op, &woken) : 0;
    wake |= woken;
    op.data += n;
    op.remaining -= n;
    if (op.remaining > 0) {
      if (n == 0) break;
      moved = true;
      continue;
    }
    ring.end_message();
    queue.pop_front();
    ++done;
    moved = true;
  }
  return moved;
}

}  // namespace

// Moves bytes through the rings of one shared-memory peer until they are
// full (sending) or empty (receiving); returns whether anything moved.
bool MeshTransport::progress_shm(int index) {
  Peer& p = peers_[index];
  Shm& shm = *p.shm;
  bool wake = false;
  bool moved = drain(p.sends, shm.out, p.sends_done, wake,
                     [&](Operation& op, bool* woken) { return shm.out.write(op.data, op.remaining, woken); });
  moved |= drain(p.recvs, shm.in, p.recvs_done, wake, [&](Operation& op, bool* woken) {
    return shm.in.read(op.data, op.remaining, op.reduce, op.dtype, op.op, woken);
  });
  if (wake) ring_doorbell(index);
  return moved;
}

// One byte on the pair's TCP connection wakes a peer that sleeps in poll().
// A full socket buffer already wakes it, so EAGAIN is fine; a dead peer is
// noticed by the next wait on it.
void MeshTransport::ring_doorbell(int index) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::send(peers_[index].fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void MeshTransport::drain_doorbell(int index) {
  Peer& p = peers_[index];
  char bytes[256];
  while (!p.closed) {
    const ssize_t n = ::recv(p.fd, bytes, sizeof bytes, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    p.closed = true;
  }
}

// One non-blocking pass over every peer. Returns whether anything moved.
bool MeshTransport::make_progress() {
  bool moved = false;
  for (int index = 0; index < size(); ++index) {
    Peer& p = peers_[index];
    if (p.sends.empty() && p.recvs.empty()) continue;
    moved |= p.shm ? progress_shm(index) : progress_tcp(index);
  }
  return moved;
}

// Sleeps until a socket is ready, a shared-memory peer rings, or a second
// passes. A shared-memory peer whose connection has closed and whose rings
// cannot move fails here: it is gone, and what it left has been consumed.
void MeshTransport::block_until_ready(Clock::time_point deadline, const Handle& handle) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) {
    const Peer& p = peers_[handle.peer];
    const std::size_t pending = handle.is_send ? p.sends.front().remaining : p.recvs.front().remaining;
    fail("Rank " + std::to_string(rank_) + " timed out: no data moved for " + seconds_text(timeout_) + " with " +
         std::to_string(pending) + " bytes still to " + (handle.is_send ? "send to " : "receive from ") +
         describe(handle.peer) + ". The peer may be hung, or the ranks called collectives in different orders.");
  }
  std::vector<pollfd> entries;
  std::vector<int> sleeping;
  for (int index = 0; index < size(); ++index) {
    Peer& p = peers_[index];
    if (p.sends.empty() && p.recvs.empty()) continue;
    if (p.shm) {
      if (p.closed) fail_lost(index, ": connection closed by the peer");
      bool sleep = true;
      if (!p.recvs.empty()) sleep &= p.shm->in.sleep_as_reader();
      if (!p.sends.empty()) sleep &= p.shm->out.sleep_as_writer();
      sleeping.push_back(index);
      if (!sleep) {
        for (int woken : sleeping) peers_[woken].shm->awake();
        return;  // the peer moved while we were announcing the sleep
      }
      entries.push_back(pollfd{p.fd, POLLIN, 0});
    } else {
      short events = 0;
      if (!p.recvs.empty()) events |= POLLIN;
      if (!p.sends.empty()) events |= POLLOUT;
      entries.push_back(pollfd{p.fd, events, 0});
    }
  }
  const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(std::min<long long>(left, 1000)));
  if (ready < 0 && errno != EINTR) fail("poll() failed: " + errno_text(errno));
  for (int index : sleeping) {
    peers_[index].shm->awake();
    drain_doorbell(index);
  }
}

void MeshTransport::wait(const Handle& handle) {
  if (!broken_.empty()) throw HoraInternalError(broken_);
  Clock::time_point last_progress = Clock::now();
  while (!is_done(handle)) {
    if (make_progress()) {
      last_progress = Clock::now();
      continue;
    }
    const Clock::duration idle = Clock::now() - last_progress;
    if (idle < kTransferSpin) {
      spin_pause(idle);
      continue;
    }
    block_until_ready(last_progress + timeout_, handle);
  }
}

void MeshTransport::abort(const std::string& reason) {
  if (broken_.empty()) broken_ = reason;
  // Shutting the connections down makes every peer's pending wait fail at
  // once instead of after its timeout, shared-memory peers included.
  for (Peer& p : peers_) {
    if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
    p.sends.clear();
    p.recvs.clear();
  }
}

bool MeshTransport::incoming(int peer) {
  check_usable(peer);
  Peer& p = peers_[peer];
  if (p.shm) return p.shm->in.readable() || p.closed;
  pollfd entry{p.fd, POLLIN, 0};
  return ::poll(&entry, 1, 0) > 0;
}

void MeshTransport::wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  if (!broken_.empty()) return;
  std::vector<pollfd> entries{pollfd{wake_fd_, POLLIN, 0}};
  bool sleep = true;
  for (int peer : peers) {
    Peer& p = peers_[peer];
    if (p.shm && !p.shm->in.sleep_as_reader()) sleep = false;
    entries.push_back(pollfd{p.fd, POLLIN, 0});
  }
  if (sleep) {
    const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(std::max<long long>(timeout.count(), 0)));
    if (ready > 0 && (entries[0].revents & POLLIN)) {
      uint64_t count = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
    }
  }
  for (int peer : peers) {
    if (!peers_[peer].shm) continue;
    peers_[peer].shm->in.awake_as_reader();
    drain_doorbell(peer);
  }
}

void MeshTransport::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void MeshTransport::fail(const std::string& reason) {
  abort(reason);
  throw HoraInternalError(reason);
}

}  // namespace hora
