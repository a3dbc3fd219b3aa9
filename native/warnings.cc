#include "warnings.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <utility>

namespace hora {
namespace {

struct Queue {
  std::mutex mutex;  // a leaf: nothing else is locked while it is held
  std::condition_variable ready;
  std::deque<std::string> warnings;
  std::size_t dropped = 0;
  bool drained = false;
};

// Never destroyed: engine threads may warn while the process exits.
Queue& queue() {
  static Queue* instance = new Queue();
  return *instance;
}

}  // namespace

void warn(const std::string& text) {
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (q.drained) {
      if (q.warnings.size() >= kQueuedWarnings) {
        q.warnings.pop_front();
        ++q.dropped;
      }
      q.warnings.push_back(text);
      q.ready.notify_one();
      return;
    }
  }
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

void set_warnings_drained(bool drained) {
  Queue& q = queue();
  std::deque<std::string> left;
  std::size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    q.drained = drained;
    if (!drained) {
      left.swap(q.warnings);
      std::swap(dropped, q.dropped);
    }
  }
  if (dropped > 0) std::fprintf(stderr, "%zu earlier warnings of the native core were dropped.\n", dropped);
  for (const std::string& text : left) std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

std::vector<std::string> take_warnings(std::chrono::milliseconds wait) {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mutex);
  q.ready.wait_for(lock, wait, [&] { return !q.warnings.empty(); });
  std::vector<std::string> taken;
  if (q.dropped > 0) {
    taken.push_back(std::to_string(q.dropped) + " earlier warnings of the native core were dropped (more than " +
                    std::to_string(kQueuedWarnings) + " came faster than they could be logged).");
    q.dropped = 0;
  }
  taken.insert(taken.end(), q.warnings.begin(), q.warnings.end());
  q.warnings.clear();
  return taken;
}

}  // namespace hora
