// Who runs the engine's cycles; the cycle protocol itself is in engine_cycle.cc.
//
// One thread at a time holds progress_, the right to
// run cycles and to use the transport. By default a background thread per
// process does. A thread that waits on a handle takes progress_ and runs the
// cycles itself (the background thread parks while any caller drives), so
// a synchronous collective crosses no thread at all: the caller submits,
// exchanges the cycle message, executes the collective and completes its own
// handle, while the other ranks' callers do the same. Hand-offs between
// threads cost tens of microseconds when threads outnumber cores; a 4 KiB
// allreduce itself costs a few. The background thread resumes once no
// caller has driven for a cycle time (longer where the ranks have no spare
// core: Engine::park), so other ranks' cycles wait at most that long for
// this rank; shutdown and failures bring it back at once.
//
// A driver that finds nothing to do polls briefly (spin.h), then sleeps in
// the transport's wait_incoming(), from which a submission or a would-be
// driver wakes it.
#include <algorithm>
#include <thread>
#include <unordered_set>

#include "engine.h"
#include "spin.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kIdlePoll{1000};

// A burst of submissions waits at most this many cycle times for more.
constexpr int kBurstCycles = 5;

// How often a waiting caller runs between_slices (Python's signal handlers).
constexpr milliseconds kSlice{100};

// How long a caller that cannot drive (another thread holds progress_)
// waits for a completion before it tries again.
constexpr milliseconds kRetry{1};

}  // namespace

// A thread that wants to run cycles, for the length of this object's life.
class Engine::Driving {
 public:
  explicit Driving(Engine& engine) : engine_(engine) {
    if (engine_.drivers_.fetch_add(1, std::memory_order_seq_cst) == 0) {
      engine_.first_driver_arrived_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
    // The background thread may be asleep in the transport holding progress_: wake it so that it parks.
    if (engine_.driver_asleep_.load(std::memory_order_seq_cst)) engine_.transport_->wake();
  }
  ~Driving() {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    if (engine_.drivers_.fetch_sub(1, std::memory_order_seq_cst) > 1) {
      engine_.hand_over();
    } else {
      const Clock::time_point now = Clock::now();
      if (engine_.last_driver_left_ != Clock::time_point{}) {
        const Clock::time_point arrived{Clock::duration{engine_.first_driver_arrived_.load(std::memory_order_relaxed)}};
        const Clock::duration away = std::clamp<Clock::duration>(arrived - engine_.last_driver_left_,
                                                                 Clock::duration::zero(), kLongestPatience);
        engine_.caller_away_ = std::max(away, engine_.caller_away_ - engine_.caller_away_ / 4);
      }
      engine_.last_driver_left_ = now;  // read by park() under mutex_, once no caller drives
    }
  }
  Driving(const Driving&) = delete;
  Driving& operator=(const Driving&) = delete;

 private:
  Engine& engine_;
};

Result Engine::run(Submission submission, const std::function<void()>& between_slices) {
  std::vector<Submission> one;
  one.push_back(std::move(submission));
  return std::move(run(std::move(one), between_slices).front());
}

std::vector<Result> Engine::run(std::vector<Submission> submissions, const std::function<void()>& between_slices) {
  Driving driving(*this);  // before submitting, so that a parked background thread stays parked
  const std::vector<int64_t> handles = submit(std::move(submissions));
  try {
    return wait(handles, between_slices);
  } catch (...) {
    // Interrupted (or failed, when the handles are gone already): nobody holds these handles to wait again, so
    // the requests complete with their buffers and their results are dropped.
    for (int64_t handle : handles) release(handle);
    throw;
  }
}

bool Engine::is_done(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  return handles_.at(handle).done;
}

Result Engine::wait(int64_t handle, const std::function<void()>& between_slices) {
  return std::move(wait(std::vector<int64_t>{handle}, between_slices).front());
}

std::vector<Result> Engine::wait(const std::vector<int64_t>& handles, const std::function<void()>& between_slices) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unordered_set<int64_t> seen;
    for (int64_t handle : handles) {
      if (!handles_.count(handle)) {
        throw std::invalid_argument("Unknown handle " + std::to_string(handle) + "; it was already synchronized.");
      }
      if (handles.size() > 1 && !seen.insert(handle).second) {
        throw std::invalid_argument("Handle " + std::to_string(handle) + " appears twice in one wait.");
      }
    }
  }
  // Every handle completes before any is consumed, so an interrupted wait
  // leaves them all in flight and the caller can wait again.
  for (int64_t handle : handles) await(handle, Clock::time_point::max(), between_slices);
  std::vector<Result> results(handles.size());
  std::exception_ptr first_error;
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const auto found = handles_.find(handles[i]);
    HandleState state = std::move(found->second);
    handles_.erase(found);
    if (state.error && !first_error) first_error = state.error;
    results[i] = std::move(state.result);
  }
  if (first_error) std::rethrow_exception(first_error);
  return results;
}

bool Engine::await(int64_t handle, Clock::time_point deadline, const std::function<void()>& between_slices) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handles_.at(handle).done) return true;
    // The caller blocks, so nothing more will come from this thread: start
    // the cycle now rather than at the end of the cycle time, if its request
    // still waits for one. (A request already sent waits for the other ranks'
    // messages, which start cycles themselves; flushing for it would leave
    // flush_ set once it completed, and the next submission, the first of a
    // burst, would go out alone.)
    if (std::any_of(queue_.begin(), queue_.end(), [&](const Submission& queued) { return queued.handle == handle; })) {
      flush_ = true;
    }
  }
  Driving driving(*this);
  for (;;) {
    const Clock::time_point until = std::min(deadline, Clock::now() + kSlice);
    uint64_t handoffs = 0;  // read before trying progress_, so a hand-over in between is not missed
    {
      std::lock_guard<std::mutex> lock(mutex_);
      handoffs = handoffs_;
    }
    std::unique_lock<std::mutex> progress(progress_, std::try_to_lock);
    if (progress.owns_lock() && !finished_) {
      drive(handle, until);
      progress.unlock();
    } else {
      if (progress.owns_lock()) progress.unlock();
      // Another thread runs the cycles (and completes this handle, or, being
      // the background thread, steps aside for this one and says so), or the
      // engine has finished and the background thread is failing what is left.
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait_until(lock, std::min(until, Clock::now() + kRetry),
                          [&] { return handles_.at(handle).done || handoffs_ != handoffs; });
    }
    if (is_done(handle)) return true;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (now >= until && between_slices) between_slices();  // may throw (an interrupted caller); the request stays in flight
  }
}

void Engine::drive(int64_t handle, Clock::time_point until) {
  try {
    while (!finished_ && !is_done(handle)) {
      if (!wait_for_cycle([] { return false; }, until)) return;
      if (!finished_) run_cycle();
    }
  } catch (const std::exception&) {
    fail_engine();
  }
  if (finished_) resume();  // the background thread fails what is left and exits
}

// Called under mutex_ by a driver that has let go of progress_ (or is about
// to) while callers may wait for it. A caller waiting on done_cv_ wakes when
// its handle completes or when this count moves; a bare notification would
// find its handle not done and send it back to sleep for the rest of kRetry,
// which cost a millisecond in every training step whose last gradients were
// still in flight when backward ended (bench/torch_training.py's MLP went
// from 0.62-0.67 of the no-exchange ceiling to 0.69-0.73).
void Engine::hand_over() {
  ++handoffs_;
  done_cv_.notify_all();
}

void Engine::fail_engine() {
  try {
    throw;
  } catch (const std::exception& error) {
    transport_->abort(error.what());
  }
  fail_everything(std::current_exception());
  finished_ = true;
}

void Engine::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    resume_ = true;
  }
  park_cv_.notify_all();
}

void Engine::loop() {
  may_spin_long() = false;  // see spin.h
  std::unique_lock<std::mutex> progress(progress_);
  const auto callers_drive = [this] { return drivers_.load(std::memory_order_relaxed) > 0; };
  while (!finished_) {
    if (callers_drive()) {
      progress.unlock();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        hand_over();  // a caller waiting for progress_ takes it now
      }
      park();
      progress.lock();
      continue;
    }
    try {
      if (wait_for_cycle(callers_drive, Clock::time_point::max()) && !finished_) run_cycle();
    } catch (const std::exception&) {
      fail_engine();
    }
  }
  progress.unlock();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  for (auto state = handles_.begin(); state != handles_.end();) {
    const auto next = std::next(state);
    if (!state->second.done) {
      state->second.error = failure_ ? failure_ : shutdown_error(" before this request completed.");
      settle(state);
    }
    state = next;
  }
  done_cv_.notify_all();
}

Clock::duration background_patience(std::chrono::microseconds cycle_time, Clock::duration caller_away,
                                    bool spare_cores) {
  const Clock::duration patience = std::max<Clock::duration>(cycle_time, std::chrono::microseconds(100));
  if (spare_cores) return patience;
  return std::max<Clock::duration>(patience, std::min<Clock::duration>(2 * caller_away, kLongestPatience));
}

void Engine::park() {
  // Back on duty once no caller has driven for a cycle time: a caller that
  // returns to Python between two synchronous collectives finds the engine
  // still parked, and costs no wake-up. Asynchronous work submitted meanwhile
  // does not bring it back sooner: it waits for more submissions for a cycle
  // time anyway, which ends no earlier than this park (under 100 us of cycle
  // time, up to 100 us later), and a caller that waits for it at once
  // (allreduce_async_, then synchronize) drives it itself, with no hand-over
  // from this thread (waking this thread for it took a 4 KiB allreduce_async_
  // and its synchronize from ~13 to ~22 us on 2 ranks here).
  //
  // Where the ranks have no spare core, it stays parked through the caller's
  // usual time away (a training step's forward and backward passes;
  // background_patience()): the gradients submitted during backward then
  // wait for the caller's synchronize, instead of being exchanged by this
  // thread on the core the backward pass computes on, where the two took
  // longer at once than in turn: bench/torch_training.py's MLP, 2 ranks on
  // the 2 cores here, 12.2-12.8 ms a step against 13.0-14.5 ms with this
  // thread back after a cycle time (through the rings; 9.7 ms without any
  // exchange). The price: meanwhile the other ranks' cycles wait for this
  // rank's caller, at most kLongestPatience.
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_ && !resume_ && !finished_) {
    const Clock::duration idle =
        background_patience(cycle_time(), caller_away_, ranks_have_spare_cores().load(std::memory_order_relaxed));
    if (drivers_.load(std::memory_order_relaxed) > 0) {
      park_cv_.wait_for(lock, idle);  // the last caller to leave does not notify: back here within `idle`
      continue;
    }
    const Clock::time_point until = last_driver_left_ + idle;
    if (Clock::now() >= until) break;
    park_cv_.wait_until(lock, until);
  }
  resume_ = false;
}

bool Engine::local_ready(Clock::time_point now, milliseconds* wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) {
    finished_ = true;
    return true;
  }
  *wait = kIdlePoll;
  if (queue_.empty()) return false;
  // A burst of submissions (a framework's backward pass) goes out together:
  // the cycle starts once submissions pause for the cycle time, or at the
  // latest kBurstCycles cycle times after the first of them.
  const auto quiet = now - queue_.back().submitted;
  const auto waited = now - queue_.front().submitted;
  const auto cycle = cycle_time();
  const auto longest = cycle * kBurstCycles;
  if (flush_ || quiet >= cycle || waited >= longest) return true;
  const auto left = std::min<Clock::duration>(cycle - quiet, longest - waited);
  *wait = std::chrono::duration_cast<milliseconds>(left) + milliseconds(1);
  return false;
}

bool Engine::wait_for_cycle(const std::function<bool()>& give_up, Clock::time_point until) {
  Clock::time_point now = Clock::now();
  const Clock::time_point start = now;
  bool announced = false;  // driver_asleep_ is set: look once more, then sleep
  for (;; now = Clock::now()) {
    milliseconds wait{0};
    bool due = local_ready(now, &wait);
    for (std::size_t i = 0; !due && i < peers_.size(); ++i) due = transport_->incoming(peers_[i]);
    for (const auto limit : {options_.stall_warning, options_.stall_shutdown}) {
      if (due || limit.count() == 0) continue;
      const auto check = table_.next_stall_check(limit);
      if (check && *check <= now) due = true;
      if (check) wait = std::min(wait, std::chrono::duration_cast<milliseconds>(*check - now) + milliseconds(1));
    }
    const bool stop = !due && (give_up() || now >= until);
    if (due || stop) {
      if (announced) driver_asleep_.store(false, std::memory_order_relaxed);
      return due;
    }
    if (now - start < spin_limit(kYieldSpin)) {
      spin_pause(now - start);
      continue;
    }
    if (!announced) {
      driver_asleep_.store(true, std::memory_order_seq_cst);
      announced = true;
      continue;
    }
    if (until != Clock::time_point::max()) {
      wait = std::min(wait, std::chrono::duration_cast<milliseconds>(until - now) + milliseconds(1));
    }
    transport_->wait_incoming(peers_, wait);
    driver_asleep_.store(false, std::memory_order_relaxed);
    announced = false;
  }
}

}  // namespace hora
