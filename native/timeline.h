// The timeline: a Chrome trace (JSON array format, opens in Perfetto or
// chrome://tracing) of what the engine did with each tensor. Every tensor is
// a row ("process" in trace terms, named after the tensor); its activities
// are nested spans: NEGOTIATE_<OP> from submission until the ranks agreed,
// then MEMCPY_IN_FUSION_BUFFER, the collective itself, and
// MEMCPY_OUT_FUSION_BUFFER. Cycle starts can be marked as instant events.
//
// Thread-safe: started and stopped from Python, written by the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hora {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline();
  ~Timeline();

  // Starts writing to `path` (replacing the file); stops a previous one.
  void start(const std::string& path, bool mark_cycles);
  void stop();
  bool active() const { return active_; }

  void begin(const std::string& tensor, const std::string& activity, Clock::time_point at);
  void end(const std::string& tensor, Clock::time_point at);
  void mark_cycle(Clock::time_point at);

 private:
  long long pid_of(const std::string& tensor);
  void write(const std::string& event);
  long long micros(Clock::time_point at) const;

  std::mutex mutex_;
  std::atomic<bool> active_{false};  // read without the lock as a fast path
  bool mark_cycles_ = false;
  std::FILE* file_ = nullptr;
  bool first_event_ = true;
  Clock::time_point origin_;
  std::unordered_map<std::string, long long> pids_;
};

}  // namespace hora
