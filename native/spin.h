// How a thread polls before it blocks. A blocked thread takes tens of
// microseconds to wake, and the message it waits for usually comes sooner,
// so waiters poll first; but a poller can hold the very core its peer needs
// when threads outnumber cores. So a waiter
//   * polls with only a pause instruction between polls for kPauseSpin
//     after the last progress: a peer running on another core answers within
//     that, and a yield would cost a system call per poll;
//   * then yields the core between polls until kYieldSpin, so that a thread
//     sharing its core (on a busy machine, the peer) runs;
//   * then blocks (poll() on its connections), which bounds the cost of an
//     idle job.
#pragma once

#include <chrono>
#include <thread>

namespace hora {

constexpr std::chrono::microseconds kPauseSpin{5};
constexpr std::chrono::microseconds kYieldSpin{50};

// Spends a moment between two polls, `idle` after the last progress.
inline void spin_pause(std::chrono::steady_clock::duration idle) {
  if (idle >= kPauseSpin) {
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
