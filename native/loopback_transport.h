// In-process transport: every rank is a thread of one process and messages
// are copied through per-pair queues. It exists to test the collectives
// without sockets, and checks message sizes strictly, so an algorithm whose
// sends and receives do not match fails here rather than corrupting data.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport.h"

namespace hora {

class LoopbackGroup;

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override;
  Handle send(int peer, const void* data, std::size_t bytes) override;
  Handle recv(int peer, void* data, std::size_t bytes) override;
  Handle recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op, double factor,
                     const void* own) override;
  void wait(const Handle& handle) override;
  void abort(const std::string& reason) override;
  std::chrono::milliseconds timeout() const override;
  bool incoming(int peer) override;
  void wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) override;
  void wake() override;

 private:
  struct PendingRecv {
    void* data;
    std::size_t bytes;
    bool reduce;
    DataType dtype;
    ReduceOp op;
    double factor;
    const void* own;
  };

  void check_peer(int peer) const;

  std::shared_ptr<LoopbackGroup> group_;
  int rank_;
  std::vector<uint64_t> sends_started_;
  std::vector<uint64_t> recvs_started_;
  std::vector<uint64_t> recvs_done_;
  std::vector<std::deque<PendingRecv>> pending_recvs_;
};

// The shared state of one in-process world: a queue per ordered pair.
class LoopbackGroup : public std::enable_shared_from_this<LoopbackGroup> {
 public:
  LoopbackGroup(int size, std::chrono::milliseconds timeout);

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::shared_ptr<LoopbackTransport> transport(int rank);

  void push(int src, int dst, const void* data, std::size_t bytes);
  std::vector<char> pop(int src, int dst);  // blocks up to timeout()
  void abort(const std::string& reason);

  bool has_message(int src, int dst);
  // Waits until a queue from one of `sources` to `dst` is non-empty, wake(dst) is called, or `timeout` passes.
  void wait_any(int dst, const std::vector<int>& sources, std::chrono::milliseconds timeout);
  void wake(int dst);

 private:
  void throw_if_aborted() const;

  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::deque<std::vector<char>>> queues_;  // index src * size + dst
  std::string abort_reason_;
  std::vector<char> woken_;  // per rank, set by wake()
};

}  // namespace hora
