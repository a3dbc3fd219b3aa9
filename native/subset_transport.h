// A view of some ranks of a transport as a world of their own: rank i of the
// view is rank members[i] of the underlying transport. Process sets run
// their collectives on such a view, over the same connections as the whole
// job. That is safe because the engine executes every collective, of every
// process set, in one order that all ranks agree on (see engine_cycle.cc).
#pragma once

#include <vector>

#include "transport.h"

namespace hora {

class SubsetTransport : public Transport {
 public:
  // `members` are ranks of `base`, ascending, and include base.rank().
  SubsetTransport(Transport& base, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Handle send(int peer, const void* data, std::size_t bytes) override;
  Handle recv(int peer, void* data, std::size_t bytes) override;
  Handle recv_reduce(int peer, void* data, std::size_t bytes, DataType dtype, ReduceOp op, double factor,
                     const void* own) override;
  void wait(const Handle& handle) override { base_.wait(handle); }
  void abort(const std::string& reason) override { base_.abort(reason); }
  std::chrono::milliseconds timeout() const override { return base_.timeout(); }
  bool incoming(int peer) override;
  void wait_incoming(const std::vector<int>& peers, std::chrono::milliseconds timeout) override;
  void wake() override { base_.wake(); }
  void set_working_set(std::size_t bytes) override { base_.set_working_set(bytes); }
  std::size_t working_set() const override { return base_.working_set(); }

  const std::vector<int>& members() const { return members_; }

 private:
  int global(int peer) const;

  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace hora
