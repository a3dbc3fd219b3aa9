// The mesh: one link per pair of ranks. This file builds it (connect, then
// shared memory for pairs on one host), routes each operation to its peer's
// link, waits and sleeps, and turns a lost link into the transport's
// failure. The links move the bytes: tcp_link.cc over a socket, shm_link.cc
// through a pair of rings; handshake.cc authenticates every connection.
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
#include "spin.h"

namespace hora {
namespace {

// A connector whose connection was dropped before the handshake finished
// tries again after this pause, until the connect deadline.
constexpr auto kReconnectPause = std::chrono::milliseconds(50);

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
                                                      bool single_copy, const std::string& secret,
                                                      std::chrono::milliseconds connect_timeout,
                                                      std::chrono::milliseconds timeout,
                                                      std::size_t single_copy_buffer_bytes) {
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
  // An acceptor flooded by strays may evict a genuine connection before it
  // answers: a dropped connection is tried again, a refusal is final.
  for (int peer = 0; peer < rank; ++peer) {
    const std::string where = "rank " + std::to_string(peer) + " at " + peers[peer].to_string();
    const auto failed = [&](const HoraInternalError& error) {
      return HoraInternalError("Rank " + std::to_string(rank) + " could not connect to " + where + ": " + error.what());
    };
    while (transport->peers_[peer].fd < 0) {
      int fd = -1;
      try {
        fd = connect_to(peers[peer], deadline);
        handshake_as_connector(fd, secret, rank, peer, where, std::min(deadline, Clock::now() + kHandshakeTimeout));
        transport->peers_[peer].fd = fd;
      } catch (const HandshakeRefused& error) {
        close_fd(fd);
        throw failed(error);
      } catch (const HoraInternalError& error) {
        close_fd(fd);
        if (Clock::now() + kReconnectPause >= deadline) throw failed(error);
        std::this_thread::sleep_for(kReconnectPause);
      }
    }
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
  const int local_ranks = hosts.empty() ? 1 : static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[rank]));
  if (!hosts.empty()) {
    transport->set_up_shared_memory(hosts, local_ranks, shared_memory, single_copy, single_copy_buffer_bytes,
                                    deadline);
  }
  set_cores_per_rank(local_ranks, available_cores());
  return transport;
}

// Pairs are set up in one global order, (lower rank, higher rank)
// ascending, which every rank follows for its own pairs: the first pair not
// yet done always has both its ranks working on it, so set-up cannot deadlock.
void MeshTransport::set_up_shared_memory(const std::vector<int>& hosts, int local_ranks, bool wanted,
                                         bool single_copy, std::size_t single_copy_buffer_bytes,
                                         Clock::time_point deadline) {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || hosts[peer] != hosts[rank_]) continue;
    Peer& p = peers_[peer];
    const bool creator = rank_ < peer;
    std::unique_ptr<ShmSegment> segment;
    bool by_reference = false;
    try {
      segment = creator ? offer_segment(p.fd, wanted, deadline) : accept_segment(p.fd, wanted, deadline);
      if (segment != nullptr) {
        by_reference = agree_single_copy(p.fd, *segment, creator, single_copy, local_ranks == 2,
                                         single_copy_buffer_bytes, deadline);
      }
    } catch (const HoraInternalError& error) {
      throw HoraInternalError("Rank " + std::to_string(rank_) + " could not set up shared memory with " +
                              describe(peer) + ": " + error.what());
    }
    if (segment != nullptr) {
      p.shm = std::make_unique<ShmLink>(std::move(segment), creator, by_reference, single_copy_buffer_bytes);
    }
  }
}

std::vector<std::string> MeshTransport::links() const {
  std::vector<std::string> kinds;
  for (int peer = 0; peer < size(); ++peer) {
    kinds.push_back(peer == rank_ ? "self" : peers_[peer].shm ? "shm" : "tcp");
  }
  return kinds;
}

std::vector<bool> MeshTransport::single_copy() const {
  std::vector<bool> flags;
  for (const Peer& p : peers_) flags.push_back(p.shm != nullptr && p.shm->single_copy());
  return flags;
}

std::vector<uint64_t> MeshTransport::sent_by_reference() const {
  std::vector<uint64_t> counts;
  for (const Peer& p : peers_) counts.push_back(p.queues.sent_by_reference);
  return counts;
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
  operation.bytes = operation.remaining;
  if (p.shm != nullptr) p.shm->prepare(operation, is_send, working_set_);
  if (is_send) {
    p.queues.sends.push_back(operation);
    return Handle{peer, true, p.queues.sends_started++};
  }
  p.queues.recvs.push_back(operation);
  return Handle{peer, false, p.queues.recvs_started++};
}

Handle MeshTransport::send(int peer, const void* data, std::size_t bytes) {
  return start(peer, true, Operation{const_cast<char*>(static_cast<const char*>(data)), bytes});
}

Handle MeshTransport::recv(int peer, void* data, std::size_t bytes) {
  return start(peer, false, Operation{static_cast<char*>(data), bytes});
}

Handle MeshTransport::recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op,
                                  double factor, const void* own) {
  return start(peer, false,
               Operation{static_cast<char*>(data), bytes, true, dtype, op, factor, static_cast<const char*>(own)});
}

bool MeshTransport::is_done(const Handle& handle) const {
  const LinkQueues& q = peers_[handle.peer].queues;
  return handle.is_send ? q.sends_done > handle.sequence : q.recvs_done > handle.sequence;
}

void MeshTransport::fail_lost(int index, const std::string& how) {
  fail("Rank " + std::to_string(rank_) + " lost its connection to " + describe(index) + how +
       ". The peer process probably exited or crashed.");
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

// One non-blocking pass over every peer, each through its link. Returns
// whether anything moved.
bool MeshTransport::make_progress() {
  bool moved = false;
  for (int index = 0; index < size(); ++index) {
    Peer& p = peers_[index];
    if (p.queues.idle()) continue;
    try {
      if (p.shm) {
        bool wake = false;
        moved |= p.shm->progress(p.queues, &wake);
        if (wake) ring_doorbell(index);
      } else {
        moved |= p.tcp.progress(p.fd, p.queues);
      }
    } catch (const LinkLost& lost) {
      fail_lost(index, lost.what());
    }
  }
  return moved;
}

// Sleeps until a socket is ready, a shared-memory peer rings, or a second
// passes. A shared-memory peer whose connection has closed and whose rings
// cannot move fails here: it is gone, and what it left has been consumed.
void MeshTransport::block_until_ready(Clock::time_point deadline, const Handle& handle) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) {
    const LinkQueues& q = peers_[handle.peer].queues;
    const std::deque<Operation>& ops = handle.is_send ? q.sends : q.recvs;
    const bool unread = handle.is_send && handle.sequence < q.sends_done + q.awaiting_release.size();
    const std::string pending =
        unread ? "a message not yet read by " + describe(handle.peer)
               : std::to_string(ops.front().remaining) + " bytes still to " +
                     (handle.is_send ? "send to " : "receive from ") + describe(handle.peer);
    fail("Rank " + std::to_string(rank_) + " timed out: no data moved for " + seconds_text(timeout_) + " with " +
         pending + ". The peer may be hung, or the ranks called collectives in different orders.");
  }
  std::vector<pollfd> entries;
  std::vector<int> sleeping;
  for (int index = 0; index < size(); ++index) {
    Peer& p = peers_[index];
    if (p.queues.idle()) continue;
    if (p.shm) {
      if (p.closed) fail_lost(index, ": connection closed by the peer");
      const bool sleep = p.shm->sleep(p.queues);
      sleeping.push_back(index);
      if (!sleep) {
        for (int woken : sleeping) peers_[woken].shm->awake();
        return;  // the peer moved while we were announcing the sleep
      }
      entries.push_back(pollfd{p.fd, POLLIN, 0});
    } else {
      short events = 0;
      if (!p.queues.recvs.empty()) events |= POLLIN;
      if (!p.queues.sends.empty()) events |= POLLOUT;
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
    if (p.shm) p.shm->abandon();  // before any buffer it passed by reference can be freed
    if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
    p.queues.sends.clear();
    p.queues.recvs.clear();
    p.queues.awaiting_release.clear();
  }
}

bool MeshTransport::incoming(int peer) {
  check_usable(peer);
  Peer& p = peers_[peer];
  if (p.shm) return p.shm->readable() || p.closed;
  pollfd entry{p.fd, POLLIN, 0};
  return ::poll(&entry, 1, 0) > 0;
}

void MeshTransport::wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  if (!broken_.empty()) return;
  std::vector<pollfd> entries{pollfd{wake_fd_, POLLIN, 0}};
  bool sleep = true;
  for (int peer : peers) {
    Peer& p = peers_[peer];
    if (p.shm && !p.shm->sleep_until_readable()) sleep = false;
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
    peers_[peer].shm->awake();
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
