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

// Whether this thread may keep polling for long (kYieldSpin) for the next
// cycle before it blocks. The engine's background thread may not: it idles
// between cycles while the framework computes on the caller's thread,
// usually on the same core, and every poll it makes is time taken from that
// computation. A caller waiting for its own result has nothing better to do
// with its core. Within a collective's transfers both keep kTransferSpin:
// the peer is on its way (see above).
inline bool& may_spin_long() {
  static thread_local bool value = true;
  return value;
}
// The longest a thread polls before it blocks: `limit`, or kPauseSpin on a
// thread that may not spin long.
inline std::chrono::microseconds spin_limit(std::chrono::microseconds limit) {
  return may_spin_long() ? limit : std::min(limit, kPauseSpin);
}
// Records how many ranks share this host and how many cores this process may use.
inline void set_cores_per_rank(int local_ranks, int cores) {
  ranks_have_cores().store(local_ranks <= cores);
  ranks_have_spare_cores().store(2 * local_ranks <= cores);
}

// Spends a moment between two polls, `idle` after the last progress (the
// caller blocks instead once `idle` reaches kYieldSpin or kTransferSpin).
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
