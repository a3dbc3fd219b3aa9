// How a thread polls before it blocks. A blocked thread takes tens of
// microseconds to wake, and the message it waits for usually comes sooner,
// so waiters poll first; but a poller can hold the very core its peer needs
// when threads outnumber cores. So a waiter
//   * polls with only a pause instruction between polls for kPauseSpin
//     after the last progress: a peer running on another core answers within
//     that, and a yield would cost a system call per poll. Only while every
//     rank of this host has a core of its own (set_cores_per_rank): when
//     ranks outnumber cores, the peer may be waiting for this very core;
//   * then yields the core between polls until kYieldSpin, so that a thread
//     sharing its core (on a busy machine, the peer) runs. Long enough to
//     cover a peer that is one reduction step behind: a waiter that sleeps
//     costs its peer a doorbell and itself a wake-up of tens of
//     microseconds, which then makes it the late one in the next step, and
//     a ring of two ranks settles into paying that on every step (1 MiB
//     allreduces took 550 us instead of 85 us with 50 us here);
//   * a caller waiting for its own collective, on a core of its own, keeps
//     yielding until kCallerSpin: its peers are computing the step that
//     brings them to the same collective, usually for longer than kYieldSpin;
//   * then blocks (poll() on its connections), which bounds the cost of an
//     idle job.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace hora {

constexpr std::chrono::microseconds kPauseSpin{5};
constexpr std::chrono::microseconds kYieldSpin{200};
// Within a collective's transfers the peer is known to be on its way, and a
// sleeper's wake-up can take hundreds of microseconds on a virtual machine
// whose idle vCPU must be woken: there, yield for up to kTransferSpin. (With
// kYieldSpin there, one 64 MiB allreduce in ten settled at 50 ms instead of 11.)
constexpr std::chrono::microseconds kTransferSpin{1000};
// A caller that reaches a collective first waits for its peers to finish
// computing their step. Asleep, it takes 0.1-2.5 ms to wake on a virtual
// machine, and every rank then waits for it: the torch MLP's exchange after
// the last rank's arrival took 0.91-1.00 ms at the median (90th percentile
// 1.09-1.27) with this against 0.94-1.11 (1.14-1.53) sleeping after
// kYieldSpin, four alternated launches each (docs/performance.md).
constexpr std::chrono::microseconds kCallerSpin{20000};

// Whether the ranks of this host have a core each. Process-wide (a process
// belongs to one job); set when the job's transport is built.
inline std::atomic<bool>& ranks_have_cores() {
  static std::atomic<bool> value{true};
  return value;
}

// Whether every rank of this host could have two cores: one for its
// framework's computation and one for the engine's background thread.
// Without that, a collective the background thread runs while the caller
// computes takes its core time from the computation (see Engine::park).
// Process-wide, as ranks_have_cores().
inline std::atomic<bool>& ranks_have_spare_cores() {
  static std::atomic<bool> value{true};
  return value;
}

// Whether this thread may keep polling for long for the next cycle before
// it blocks. The engine's background thread may not: it idles between
// cycles while the framework computes on the caller's thread, usually on the
// same core, and every poll it makes is time taken from that computation. A
// caller waiting for its own result has nothing better to do with its core.
// Within a collective's transfers both keep kTransferSpin: the peer is on
// its way (see above).
inline bool& may_spin_long() {
  static thread_local bool value = true;
  return value;
}
// The longest a thread polls for the next cycle before it blocks:
// kCallerSpin for a caller on a core of its own, kYieldSpin for one that
// shares its core with other ranks (its polls take time from them), and
// kPauseSpin for a thread that may not spin long (may_spin_long()).
inline std::chrono::microseconds cycle_spin_limit(bool long_polls_allowed, bool core_of_its_own) {
  if (!long_polls_allowed) return kPauseSpin;
  return core_of_its_own ? kCallerSpin : kYieldSpin;
}
// Records how many ranks share this host and how many cores this process may use.
inline void set_cores_per_rank(int local_ranks, int cores) {
  ranks_have_cores().store(local_ranks <= cores);
  ranks_have_spare_cores().store(2 * local_ranks <= cores);
}

// Spends a moment between two polls, `idle` after the last progress (the
// caller blocks instead once `idle` reaches its limit above).
inline void spin_pause(std::chrono::steady_clock::duration idle) {
  if (idle >= kPauseSpin || !ranks_have_cores().load(std::memory_order_relaxed)) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace hora
