// The engine: turns requests submitted in any order into collectives
// executed in the same order on every rank. See engine_cycle.cc for the cycle
// protocol, and engine_progress.cc for who runs it: a background thread per
// process, or the caller itself while it waits on a handle.
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autotune.h"
#include "executor.h"
#include "request_table.h"
#include "process_sets.h"
#include "response_cache.h"
#include "timeline.h"
#include "transport.h"

namespace hora {

struct EngineOptions {
  std::size_t fusion_threshold_bytes = 64 * 1024 * 1024;
  // How long a submitted request may wait for more to fuse with before a
  // cycle starts; a thread waiting on a handle starts the cycle at once.
  std::chrono::microseconds cycle_time{1000};
  std::size_t cache_capacity = 1024;
  std::chrono::milliseconds stall_warning{60000};   // 0 disables the stall inspector
  std::chrono::milliseconds stall_shutdown{0};      // 0: a stall never becomes an error
  std::chrono::milliseconds shutdown_timeout{10000};
  // The host number of every rank (empty: unknown, as if one rank per host).
  std::vector<int> hosts;
  // Hierarchical allreduce for the whole job: on, off, or (unset) whenever
  // the placement allows it (several hosts with the same number of ranks, at
  // least two, on each).
  std::optional<bool> hierarchical_allreduce;
  // Online tuning of the fusion threshold, cycle time, cache and hierarchical
  // allreduce (autotune.h); rank 0 tunes and writes the log.
  AutotuneOptions autotune;
};

// How long the background thread stays parked once the last caller stopped
// driving (Engine::park): a cycle time, at least 100 us. When the ranks of
// this host have no spare core (spin.h), twice as long as the caller
// recently stayed away from the engine between two drives (a training
// step's computation) if that is longer, up to kLongestPatience: a
// collective the background thread ran meanwhile would take its core time
// from that computation, and the caller runs it itself when it next waits.
// The cap covers CPU training steps up to 125 ms (the small CNN of
// bench/torch_training.py takes 60: with a 50 ms cap the thread came back
// during its backward pass, and a step took 61.8-66.0 ms against 57.9-62.3
// with 200 ms, three alternated pairs of launches); the other ranks' cycles
// wait for a computing rank's caller at most this long.
inline constexpr std::chrono::milliseconds kLongestPatience{250};
std::chrono::steady_clock::duration background_patience(std::chrono::microseconds cycle_time,
                                                        std::chrono::steady_clock::duration caller_away,
                                                        bool spare_cores);

class Engine {
 public:
  Engine(std::shared_ptr<Transport> transport, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool hierarchical_allreduce() const { return parameters().hierarchical_allreduce; }

  // Queues a request and returns its handle at once. Throws
  // std::invalid_argument for a name already in flight or an unknown
  // process set, and the engine's failure once it has failed.
  int64_t submit(Submission submission);
  // Queues several requests at once (a group): all are checked first, and
  // either all are queued or none is.
  std::vector<int64_t> submit(std::vector<Submission> submissions);

  // submit() then wait(): the synchronous form, which drives the engine on
  // the calling thread from the start. Nobody holds the handles: if
  // `between_slices` throws, the requests are released (they complete with
  // their buffers, results dropped).
  Result run(Submission submission, const std::function<void()>& between_slices = {});
  std::vector<Result> run(std::vector<Submission> submissions, const std::function<void()>& between_slices = {});

  bool poll(int64_t handle);
  // How many handles the engine holds: requests in flight, and completed
  // ones not yet waited for or released.
  std::size_t open_handles() const;
  // Blocks until the request completes; returns its result or throws its
  // error. The handle is released either way. The calling thread runs the
  // engine's cycles itself while it waits (unless another thread is already
  // doing so), which saves the hand-offs to and from the background thread.
  // `between_slices`, if given, runs every 100 ms while waiting; if it
  // throws, the exception propagates and the handle stays valid (the
  // request is still in flight).
  Result wait(int64_t handle, const std::function<void()>& between_slices = {});
  // Waits for several handles (a group) and returns their results in order,
  // or throws the first failure once all have completed; all are released
  // either way. An exception from `between_slices` leaves all of them in flight.
  std::vector<Result> wait(const std::vector<int64_t>& handles, const std::function<void()>& between_slices = {});

  // The caller gives up `handle` without waiting for it (the Python handle
  // was dropped). A request still in flight runs to completion with its
  // buffers, which its submission keeps alive; its result is then discarded.
  // Unknown or already released handles are ignored.
  void release(int64_t handle);

  // Stops the engine on every rank: the others' pending and later requests
  // fail with HoraError (as in Horovod, one rank leaving ends the job).
  // Waits up to the shutdown timeout for the others to take part, then stops the
  // thread. Idempotent.
  void shutdown();

  Timeline& timeline() { return timeline_; }
  // The parameters in force (tuned ones included).
  TunedParameters parameters() const;
  std::vector<int> process_set(int id) const;  // empty when there is no such set
  std::vector<int> process_set_ids() const;
  // How many tensors' responses were agreed from the response cache without
  // the request table (engine_cycle.cc): a statistic.
  uint64_t agreed_from_cache() const { return agreed_from_cache_.load(std::memory_order_relaxed); }

 private:
  struct HandleState {
    bool done = false;
    Result result;
    std::exception_ptr error;
    std::string key;
    bool released = false;  // nobody will wait: forget the state once done
  };

  // Registers a thread that wants to run cycles for the length of its
  // lifetime: the background thread steps aside (parks) while any does.
  class Driving;
  // Waits for `handle` as wait() does, until `deadline`; returns whether it completed.
  bool await(int64_t handle, std::chrono::steady_clock::time_point deadline,
             const std::function<void()>& between_slices);
  // In a catch block, with progress_ held: fails every request and finishes the engine.
  void fail_engine();
  // The error of a request refused or cut short by the job's shutdown (call with mutex_ held).
  std::exception_ptr shutdown_error(const std::string& when) const;
  // Brings the background thread back from park() at once.
  void resume();
  void hand_over();

  void check(const Request& request) const;  // throws std::invalid_argument
  void log_line(const std::string& text) const;  // a warning, prefixed with this rank
  void loop();
  void park();
  void plan_hierarchy();
  bool is_done(int64_t handle);
  // With progress_ held: drives until `handle` completes, `until` passes or
  // the engine finishes.
  void drive(int64_t handle, std::chrono::steady_clock::time_point until);
  // With progress_ held: waits until a cycle is due and returns true, or
  // returns false once `give_up()` holds or `until` passes.
  bool wait_for_cycle(const std::function<bool()>& give_up, std::chrono::steady_clock::time_point until);
  bool local_ready(std::chrono::steady_clock::time_point now, std::chrono::milliseconds* wait);
  // Moves the queued submissions into `fresh` (emptied first), which lends
  // its memory to the queue in exchange.
  void take_queue(std::vector<Submission>& fresh);
  void run_cycle();
  // This rank's cycle message, into `message`.
  void encode_message(const std::vector<Submission>& fresh, const std::string& abort_reason,
                      std::vector<char>& message);
  // Checks that rank `from`'s cycle message belongs to this cycle and reads
  // the reason it gives for stopping the job into `abort_reason` (unless that
  // holds one already); returns the reader, at the message's cache slots.
  Reader open_message(int from, const std::vector<char>& message, std::string& abort_reason) const;
  // Counts how many members of its process set announced each slot in announced_.
  void count_announcements();
  // Adds the requests of rank `from`'s cycle message (its slots in
  // announced_, the rest in `in`) to the table.
  void decode_message(int from, Reader& in, std::chrono::steady_clock::time_point now);
  void apply(const std::vector<Response>& responses);
  // Switches to `parameters` (on every rank at the same cycle: see autotune.h).
  void use_parameters(const TunedParameters& parameters);
  std::chrono::microseconds cycle_time() const {
    return std::chrono::microseconds(cycle_time_us_.load(std::memory_order_relaxed));
  }
  // Completes the handles in `completed` with their results, and empties it.
  void complete(std::vector<std::pair<int64_t, Result>>& completed);
  void fail(int64_t handle, std::exception_ptr error);
  void fail_everything(std::exception_ptr error);
  // Under mutex_: marks `state` done; forgets it at once if it was released.
  void settle(std::unordered_map<int64_t, HandleState>::iterator state);

  // Receives rank `peer`'s cycle message into `body`.
  void receive_message(int peer, std::vector<char>& body);

  std::shared_ptr<Transport> transport_;
  EngineOptions options_;
  int rank_;
  int size_;

  // Shared with the submitting threads, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  std::vector<Submission> queue_;
  std::unordered_map<int64_t, HandleState> handles_;
  std::unordered_set<std::string> in_flight_;
  int64_t next_handle_ = 1;
  bool flush_ = false;
  bool stop_ = false;
  bool stopped_ = false;
  std::exception_ptr failure_;
  std::string shutdown_reason_ = "Hora shut down on this rank";
  // Only other ranks asked to shut down: to this rank that is a lost peer (HoraInternalError, as Horovod's
  // torch API raises), which an elastic job recovers from; its own shutdown is a plain HoraError.
  bool shutdown_by_peers_ = false;
  ProcessSets sets_;

  // Who runs the cycles. progress_ is held by the thread that does: the
  // background thread, or a caller waiting on a handle (drivers_ counts
  // those, and the background thread parks while there are any). The
  // driver sleeping in the transport's wait_incoming() sets driver_asleep_,
  // so that a submission or a would-be driver knows to wake it.
  std::mutex progress_;
  std::atomic<int> drivers_{0};
  std::atomic<bool> driver_asleep_{false};
  std::atomic<bool> finished_{false};
  // Under mutex_: when the last caller stopped driving, and whether the
  // background thread must take over at once (shutdown, or the engine finished).
  std::condition_variable park_cv_;
  std::chrono::steady_clock::time_point last_driver_left_{};
  // Under mutex_: how long the caller stayed away between its recent drives,
  // a maximum that decays by a quarter at each drive (background_patience()).
  std::chrono::steady_clock::duration caller_away_{};
  // When the first of the current drivers arrived (steady_clock ticks).
  std::atomic<std::chrono::steady_clock::rep> first_driver_arrived_{0};
  // Under mutex_: moves whenever progress_ may have become free for a caller
  // waiting on done_cv_ (which otherwise wakes it only when its handle
  // completes); see Engine::hand_over().
  uint64_t handoffs_ = 0;
  bool resume_ = false;
  std::vector<int> peers_;  // every rank but this one
  std::atomic<long long> cycle_time_us_;  // read by the parked background thread too
  TunedParameters parameters_;              // under mutex_: what parameters() reports

  // Owned by the thread holding progress_.
  using PendingMap = std::unordered_map<std::string, Submission>;
  PendingMap pending_;  // this rank's submissions sent to the others, by key
  std::vector<std::vector<char>> messages_;  // this cycle's messages, by rank (their memory reused every cycle)
  std::vector<std::vector<int>> announced_;  // the cache slots in each rank's message of this cycle
  std::vector<int> announcements_;           // by slot: how many members announced it this cycle (-1: agreed)
  std::atomic<uint64_t> agreed_from_cache_{0};
  ResponseCache cache_;
  RequestTable table_;  // the same table on every rank
  Timeline timeline_;
  Executor executor_;
  uint64_t cycle_ = 0;
  bool cache_enabled_ = true;
  std::optional<Autotuner> autotuner_;  // made once the placement is known
  std::optional<TunedParameters> announce_;  // rank 0: to send with its next cycle message
  // What every cycle fills and empties again, kept between cycles so that a
  // cycle reuses their memory instead of allocating it: with these, a
  // synchronous 4 KiB allreduce makes 23 allocations a call instead of 43,
  // and takes the engine 1.8 us on one rank instead of 2.3.
  struct Scratch {
    std::vector<Submission> fresh;     // this rank's submissions of the cycle
    std::vector<int> slots;            // those announced by response cache slot
    std::vector<const Request*> full;  // those sent in full
    std::vector<uint64_t> bits;        // a message's slots as a bit vector
    std::vector<Handle> sends;
    std::vector<Reader> readers;       // by rank
    std::string key;                   // request_key()'s format
    std::vector<PendingMap::iterator> found;  // by tensor of a response: this rank's submission, or end()
    std::vector<const Submission*> mine;      // the same, as the executor takes them (nullptr: none)
    std::vector<Result> results;
    std::vector<std::pair<int64_t, Result>> completed;
  } scratch_;

  std::thread thread_;
};

}  // namespace hora
