// Warnings from the native core, for Python's logging.
//
// The threads that notice something worth a warning (the engine's, a
// transport's) must never take the GIL: they hold locks that Python threads
// wait for. So a warning is queued here, and a Python thread that hora.init()
// starts drains the queue into logging.getLogger("hora"). While nothing
// drains it (the core used without hora.init, or after shutdown), warnings
// go to stderr as they come. The queue holds at most kQueuedWarnings; a
// flood drops the oldest and says how many.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace hora {

constexpr std::size_t kQueuedWarnings = 1000;

void warn(const std::string& text);

// Whether warnings are queued for a drainer (true) or written to stderr.
void set_warnings_drained(bool drained);

// Waits up to `wait` for warnings and returns those queued (oldest first).
std::vector<std::string> take_warnings(std::chrono::milliseconds wait);

}  // namespace hora
