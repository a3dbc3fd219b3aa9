// The engine's state shared with the threads that submit: construction,
// submission, handles and their completion, shutdown. The cycle protocol,
// which turns submissions into the same collectives on every rank, is in
// engine_cycle.cc; who runs it (the background thread or a waiting caller),
// in engine_progress.cc.
#include "engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "errors.h"
#include "reduce.h"
#include "warnings.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void Engine::log_line(const std::string& text) const { warn("[hora rank " + std::to_string(rank_) + "] " + text); }

Engine::Engine(std::shared_ptr<Transport> transport, EngineOptions options)
    : transport_(std::move(transport)),
      options_(options),
      rank_(transport_->rank()),
      size_(transport_->size()),
      sets_(size_),
      cache_(options.cache_capacity),
      table_(size_, options.fusion_threshold_bytes),
      executor_(*transport_, timeline_) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) peers_.push_back(peer);
  }
  plan_hierarchy();
  parameters_.fusion_threshold_bytes = options_.fusion_threshold_bytes;
  parameters_.cycle_time = options_.cycle_time;
  parameters_.cache_enabled = options_.cache_capacity > 0;
  parameters_.hierarchical_allreduce = executor_.hierarchical();
  cycle_time_us_ = options_.cycle_time.count();
  AutotuneOptions tuning = options_.autotune;
  tuning.enabled = tuning.enabled && rank_ == 0;  // rank 0 tunes for all (see autotune.h)
  tuning.cache_fixed = tuning.cache_fixed || options_.cache_capacity == 0;
  autotuner_.emplace(tuning, parameters_, executor_.hierarchical());
  thread_ = std::thread([this] { loop(); });
}

void Engine::plan_hierarchy() {
  const std::vector<int>& hosts = options_.hosts;
  if (options_.hierarchical_allreduce == false || hosts.size() != static_cast<std::size_t>(size_)) return;
  std::map<int, std::vector<int>> members;  // host -> its ranks, ascending
  for (int rank = 0; rank < size_; ++rank) members[hosts[rank]].push_back(rank);
  const std::size_t local_size = members.begin()->second.size();
  bool fits = members.size() >= 2 && local_size >= 2;
  for (const auto& [host, ranks] : members) fits &= ranks.size() == local_size;
  if (!fits) {
    if (options_.hierarchical_allreduce == true && rank_ == 0) {
      log_line("hierarchical allreduce needs several hosts with the same number of ranks (at least 2) on "
                      "each; this job has " + std::to_string(members.size()) + " host(s), so it uses one ring.");
    }
    return;
  }
  const std::vector<int>& host = members.at(hosts[rank_]);
  const std::size_t local_rank = std::find(host.begin(), host.end(), rank_) - host.begin();
  std::vector<int> cross;
  for (const auto& [number, ranks] : members) cross.push_back(ranks[local_rank]);
  std::sort(cross.begin(), cross.end());
  executor_.use_hierarchy(host, cross);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  park_cv_.notify_all();
  transport_->wake();
  if (thread_.joinable()) thread_.join();
}

std::vector<int> Engine::process_set(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<int>* members = sets_.find(id);
  return members ? *members : std::vector<int>{};
}

std::vector<int> Engine::process_set_ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_.ids();
}

void Engine::check(const Request& request) const {
  const std::vector<int>* members = sets_.find(request.process_set);
  if (members == nullptr) {
    throw std::invalid_argument("Process set " + std::to_string(request.process_set) +
                                " does not exist; add it with hora.add_process_set() first.");
  }
  if (sets_.member_index(request.process_set, rank_) < 0) {
    throw std::invalid_argument("Rank " + std::to_string(rank_) + " is not a member of process set " +
                                std::to_string(request.process_set) + "; only its members may call collectives on it.");
  }
  for (const auto& [what, factor] : {std::pair{"prescale_factor", request.prescale},
                                     std::pair{"postscale_factor", request.postscale}}) {
    // NaN would also defeat the cross-rank comparison (NaN != NaN): every rank would report a mismatch.
    if (!std::isfinite(factor)) {
      throw std::invalid_argument(std::string(what) + " must be a finite number, got " + std::to_string(factor) +
                                  " for tensor '" + request.name + "'.");
    }
  }
  if (request.kind == RequestKind::kAllreduce || request.kind == RequestKind::kReducescatter) {
    check_reduction(request.dtype, request.op);
    if (request.dtype == DataType::kBool && (request.prescale != 1.0 || request.postscale != 1.0)) {
      throw std::invalid_argument("Scale factors are not defined for bool tensors; got prescale " +
                                  std::to_string(request.prescale) + " and postscale " +
                                  std::to_string(request.postscale) + ".");
    }
  }
}

int64_t Engine::submit(Submission submission) {
  std::vector<Submission> one;
  one.push_back(std::move(submission));
  return submit(std::move(one)).front();
}

std::exception_ptr Engine::shutdown_error(const std::string& when) const {
  if (shutdown_by_peers_) return std::make_exception_ptr(HoraInternalError(shutdown_reason_ + when));
  return std::make_exception_ptr(HoraError(shutdown_reason_ + when));
}

std::vector<int64_t> Engine::submit(std::vector<Submission> submissions) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (stopped_ || stop_) std::rethrow_exception(shutdown_error("; no more requests can run on this rank."));
  // Check the whole batch before queuing any of it: a group goes in whole or not at all.
  std::set<std::string> group_keys;  // a group's names must differ too
  for (Submission& submission : submissions) {
    const Request& request = submission.request;
    check(request);
    submission.key = request_key(request.process_set, request.name);
    const std::string& key = submission.key;
    if (in_flight_.count(key) || (submissions.size() > 1 && !group_keys.insert(key).second)) {
      throw std::invalid_argument("A request named '" + request.name + "' is already in flight on rank " +
                                  std::to_string(rank_) + "; wait for it before submitting another with that name, "
                                  "or give each tensor its own name.");
    }
  }
  const bool was_empty = queue_.empty();
  const Clock::time_point now = Clock::now();
  std::vector<int64_t> handles;
  for (std::size_t i = 0; i < submissions.size(); ++i) {
    Submission& submission = submissions[i];
    in_flight_.insert(submission.key);
    const int64_t handle = next_handle_++;
    handles_[handle].key = submission.key;
    submission.handle = handle;
    submission.submitted = now;
    queue_.push_back(std::move(submission));
    handles.push_back(handle);
  }
  const bool urgent = was_empty || flush_;
  lock.unlock();
  // A parked background thread is not woken for it (see Engine::park).
  // A driver that is not asleep finds the queue on its own.
  if (urgent && driver_asleep_.load(std::memory_order_seq_cst)) transport_->wake();
  return handles;
}

bool Engine::poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = handles_.find(handle);
  if (found == handles_.end()) throw std::invalid_argument("Unknown handle " + std::to_string(handle) + ".");
  return found->second.done;
}

std::size_t Engine::open_handles() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return handles_.size();
}

void Engine::shutdown() {
  if (!thread_.joinable()) return;
  bool agreed = false;
  try {
    Submission request;
    request.request.kind = RequestKind::kShutdown;
    request.request.name = "shutdown";
    const int64_t handle = submit(std::move(request));
    agreed = await(handle, Clock::now() + options_.shutdown_timeout, {});
  } catch (const std::exception&) {
    // Already failed or stopped: nothing to agree on.
  }
  if (!agreed) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_ && !stopped_) {
      log_line("shutdown: the other ranks did not take part in the shutdown within " +
                          seconds_text(options_.shutdown_timeout) + "; leaving anyway.");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  park_cv_.notify_all();
  transport_->wake();
  thread_.join();
  timeline_.stop();
}

void Engine::take_queue(std::vector<Submission>& fresh) {
  fresh.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  fresh.swap(queue_);
  flush_ = false;
}

TunedParameters Engine::parameters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return parameters_;
}

void Engine::complete(std::vector<std::pair<int64_t, Result>>& completed) {
  if (completed.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [handle, result] : completed) {
      const auto state = handles_.find(handle);
      if (state == handles_.end()) continue;  // cannot happen: a state lives until waited on or released and done
      state->second.result = std::move(result);
      settle(state);
    }
    done_cv_.notify_all();
  }
  completed.clear();
}

void Engine::fail(int64_t handle, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto state = handles_.find(handle);
  if (state == handles_.end()) return;  // cannot happen, as in complete()
  state->second.error = std::move(error);
  settle(state);
  done_cv_.notify_all();
}

void Engine::fail_everything(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = error;
  for (auto state = handles_.begin(); state != handles_.end();) {
    const auto next = std::next(state);
    if (!state->second.done) {
      state->second.error = failure_;
      settle(state);
    }
    state = next;
  }
  in_flight_.clear();
  queue_.clear();
  pending_.clear();
  done_cv_.notify_all();
}

void Engine::settle(std::unordered_map<int64_t, HandleState>::iterator state) {
  state->second.done = true;
  in_flight_.erase(state->second.key);
  if (state->second.released) handles_.erase(state);
}

void Engine::release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto state = handles_.find(handle);
  if (state == handles_.end()) return;
  if (state->second.done) {
    handles_.erase(state);
  } else {
    state->second.released = true;
  }
}

}  // namespace hora
