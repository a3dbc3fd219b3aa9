// The transport of a real job: a full mesh with one link per pair of ranks.
// Every pair has an authenticated TCP connection; a pair on the same host
// also shares a memory segment (shm_segment.h, shm_link.h) and then moves its bytes through
// it, keeping the TCP connection as its doorbell and as the sign of life:
// the kernel closes it when the peer dies, however it dies.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "link_queues.h"
#include "shm_link.h"
#include "tcp_link.h"
#include "tcp_socket.h"
#include "transport.h"

namespace hora {

class MeshTransport : public Transport {
 public:
  // Builds the mesh: this rank connects to every lower rank and accepts a
  // connection from every higher rank on `listener`, authenticating each
  // with `secret` (see mesh_transport.cc). Ranks with equal `hosts` entries
  // then set up shared memory unless `shared_memory` is false on either side
  // (or the system refuses it); the others, or all when `hosts` is empty, use TCP.
  // A shared-memory pair passes large messages of buffers of at least
  // `single_copy_buffer_bytes` by reference (shm_link.h) unless `single_copy`
  // is false on either side or the system refuses it. Every rank must give
  // the same `single_copy_buffer_bytes` (the default; tests lower it): the
  // set-up fails naming both values otherwise.
  static std::unique_ptr<MeshTransport> connect(TcpListener& listener, int rank, const std::vector<PeerAddress>& peers,
                                                const std::vector<int>& hosts, bool shared_memory, bool single_copy,
                                                const std::string& secret, std::chrono::milliseconds connect_timeout,
                                                std::chrono::milliseconds timeout,
                                                std::size_t single_copy_buffer_bytes = kSingleCopyBufferBytes);
  ~MeshTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Handle send(int peer, const void* data, std::size_t bytes) override;
  Handle recv(int peer, void* data, std::size_t bytes) override;
  Handle recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op, double factor,
                     const void* own) override;
  void wait(const Handle& handle) override;
  void abort(const std::string& reason) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool incoming(int peer) override;
  void wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) override;
  void wake() override;
  void set_working_set(std::size_t bytes) override { working_set_ = bytes; }
  std::size_t working_set() const override { return working_set_; }

  // "shm" or "tcp" for each peer, "self" for this rank.
  std::vector<std::string> links() const;
  // Whether each peer's link passes large messages by reference (false for TCP and self).
  std::vector<bool> single_copy() const;
  // How many messages this rank has passed to each peer by reference so far
  // (a diagnostic: read it while no collective runs).
  std::vector<uint64_t> sent_by_reference() const;

 private:
  struct Peer {
    int fd = -1;
    PeerAddress address;
    std::unique_ptr<ShmLink> shm;  // null: bytes go over fd, through tcp
    TcpLink tcp;
    bool closed = false;  // fd reached end of file (a shared-memory peer may still have bytes in the ring)
    LinkQueues queues;
  };

  MeshTransport(int rank, const std::vector<PeerAddress>& peers, std::chrono::milliseconds timeout);
  // `local_ranks`: how many ranks `hosts` puts on this rank's host, itself included.
  void set_up_shared_memory(const std::vector<int>& hosts, int local_ranks, bool wanted, bool single_copy,
                            std::size_t single_copy_buffer_bytes, Clock::time_point deadline);
  Handle start(int peer, bool is_send, Operation operation);
  void check_usable(int peer) const;
  bool is_done(const Handle& handle) const;
  bool make_progress();
  void ring_doorbell(int index);
  void drain_doorbell(int index);
  void block_until_ready(Clock::time_point deadline, const Handle& handle);
  [[noreturn]] void fail_lost(int index, const std::string& how);
  [[noreturn]] void fail(const std::string& reason);
  std::string describe(int peer) const;

  int rank_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;
  std::string broken_;
  int wake_fd_ = -1;  // an eventfd, written by wake()
  std::size_t working_set_ = 0;
};

}  // namespace hora
