#include "timeline.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace hora {
namespace {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

Timeline::Timeline() = default;

Timeline::~Timeline() { stop(); }

void Timeline::start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ != nullptr) {
    std::fputs("\n]\n", file_);
    std::fclose(file_);
  }
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    active_ = false;
    throw std::invalid_argument("Cannot write the timeline to '" + path + "': " + std::strerror(errno) + ".");
  }
  std::fputs("[\n", file_);
  first_event_ = true;
  pids_.clear();
  origin_ = Clock::now();
  mark_cycles_ = mark_cycles;
  active_ = true;
}

void Timeline::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = false;
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

long long Timeline::micros(Clock::time_point at) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(at - origin_).count();
}

void Timeline::write(const std::string& event) {
  if (!first_event_) std::fputs(",\n", file_);
  first_event_ = false;
  std::fputs(event.c_str(), file_);
}

long long Timeline::pid_of(const std::string& tensor) {
  auto [at, inserted] = pids_.try_emplace(tensor, static_cast<long long>(pids_.size()) + 1);
  if (inserted) {
    write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(at->second) +
          ", \"args\": {\"name\": " + json_string(tensor) + "}}");
    write("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(at->second) +
          ", \"args\": {\"sort_index\": " + std::to_string(at->second) + "}}");
  }
  return at->second;
}

void Timeline::begin(const std::string& tensor, const std::string& activity, Clock::time_point at) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;
  const long long pid = pid_of(tensor);
  write("{\"name\": " + json_string(activity) + ", \"ph\": \"B\", \"ts\": " + std::to_string(micros(at)) +
        ", \"pid\": " + std::to_string(pid) + ", \"tid\": 1}");
}

void Timeline::end(const std::string& tensor, Clock::time_point at) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;
  const long long pid = pid_of(tensor);
  write("{\"ph\": \"E\", \"ts\": " + std::to_string(micros(at)) + ", \"pid\": " + std::to_string(pid) +
        ", \"tid\": 1}");
}

void Timeline::mark_cycle(Clock::time_point at) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr || !mark_cycles_) return;
  write("{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " + std::to_string(micros(at)) +
        ", \"pid\": 0, \"tid\": 0}");
}

}  // namespace hora
