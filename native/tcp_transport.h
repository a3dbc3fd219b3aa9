// TCP transport: one authenticated connection per pair of ranks.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tcp_socket.h"
#include "transport.h"

namespace hora {

class TcpTransport : public Transport {
 public:
  // Builds the full mesh: this rank connects to every lower rank and accepts
  // a connection from every higher rank on `listener`. Each connection is
  // authenticated with `secret` before it is used (see tcp_transport.cc).
  static std::unique_ptr<TcpTransport> connect(TcpListener& listener, int rank, const std::vector<PeerAddress>& peers,
                                               const std::string& secret, std::chrono::milliseconds connect_timeout,
                                               std::chrono::milliseconds timeout);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Handle send(int peer, const void* data, std::size_t bytes) override;
  Handle recv(int peer, void* data, std::size_t bytes) override;
  void wait(const Handle& handle) override;
  void abort(const std::string& reason) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool incoming(int peer) override;
  void wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) override;
  void wake() override;

 private:
  struct Operation {
    char* data;
    std::size_t remaining;
  };
  struct Peer {
    int fd = -1;
    PeerAddress address;
    std::deque<Operation> sends;
    std::deque<Operation> recvs;
    uint64_t sends_started = 0;
    uint64_t sends_done = 0;
    uint64_t recvs_started = 0;
    uint64_t recvs_done = 0;
  };

  TcpTransport(int rank, const std::vector<PeerAddress>& peers, std::chrono::milliseconds timeout);
  void check_usable(int peer) const;
  bool is_done(const Handle& handle) const;
  bool make_progress();
  template <typename Transfer>
  bool advance(int index, std::deque<Operation>& queue, uint64_t& done, const char* verb, Transfer transfer);
  void block_until_ready(Clock::time_point deadline, const Handle& handle);
  [[noreturn]] void fail(const std::string& reason);
  std::string describe(int peer) const;

  int rank_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;
  std::string broken_;
  int wake_fd_ = -1;  // an eventfd, written by wake()
};

}  // namespace hora
