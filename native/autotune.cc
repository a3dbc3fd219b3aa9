#include "autotune.h"

#include <algorithm>
#include <cstdio>

#include "warnings.h"

namespace hora {
namespace {

constexpr std::size_t kMiB = 1024 * 1024;

// A job whose tensors never repeat (fresh automatic names every call) has no
// steps to measure: after this many distinct tensors in one sample, give up.
constexpr std::size_t kMostDistinctTensors = 10000;

// Candidates, as Horovod's search space: fusion thresholds up to 64 MiB, cycle times from 1 ms up.
const std::size_t kFusionThresholds[] = {0, 1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
const std::chrono::microseconds kCycleTimes[] = {std::chrono::microseconds(500), std::chrono::microseconds(1000),
                                                 std::chrono::microseconds(2500), std::chrono::microseconds(5000),
                                                 std::chrono::microseconds(10000)};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

Autotuner::Autotuner(AutotuneOptions options, TunedParameters initial, bool hierarchical_possible)
    : options_(std::move(options)),
      current_(initial),
      best_(initial),
      active_(options_.enabled),
      warmups_left_(std::max(1, options_.warmup_samples)) {  // at least the sample of the initial values
  options_.steps_per_sample = std::max(1, options_.steps_per_sample);
  options_.samples_per_trial = std::max(1, options_.samples_per_trial);
  if (!active_) return;
  if (!options_.log_path.empty()) {
    log_.open(options_.log_path, std::ios::out | std::ios::trunc);
    if (!log_.is_open()) {
      warn("hora autotune: cannot write the log file '" + options_.log_path + "'; tuning without a log.");
    } else {
      log_ << "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,tensor_fusion_threshold,"
              "score\n";
      log_.flush();
    }
  }
  plan(hierarchical_possible);
}

void Autotuner::plan(bool hierarchical_possible) {
  if (!options_.fusion_threshold_fixed) stage_names_.push_back("fusion_threshold");
  if (!options_.cycle_time_fixed) stage_names_.push_back("cycle_time");
  if (!options_.cache_fixed) stage_names_.push_back("cache");
  if (!options_.hierarchical_fixed && hierarchical_possible) stage_names_.push_back("hierarchical_allreduce");
  if (stage_names_.empty()) active_ = false;  // nothing left to tune
}

void Autotuner::applied() {
  waiting_ = false;
  sampling_ = false;  // the next sample starts with the next collective, under the new parameters
}

std::optional<TunedParameters> Autotuner::record(const std::vector<std::string>& names, std::size_t bytes,
                                                 Clock::time_point now) {
  if (!active_ || waiting_ || names.empty()) return std::nullopt;
  if (!sampling_) {
    sampling_ = true;
    sample_start_ = now;
    sample_bytes_ = 0;
    completions_.clear();
  }
  // A step ends when a tensor completes again; the sample, after steps_per_sample steps.
  bool sample_done = false;
  for (const std::string& name : names) {
    if (++completions_[name] > options_.steps_per_sample) sample_done = true;
  }
  if (!sample_done) {
    sample_bytes_ += bytes;
    if (completions_.size() > kMostDistinctTensors) {
      active_ = false;
      warn("hora autotune: no tensor completed twice in " + std::to_string(kMostDistinctTensors) +
           " collectives (unnamed asynchronous calls get a new name each time), so there are no steps to measure; "
           "the parameters stay as they are. Name the tensors to tune.");
      current_ = best_;
      return std::nullopt;
    }
    return std::nullopt;
  }
  const double microseconds = std::chrono::duration<double, std::micro>(now - sample_start_).count();
  const double score = microseconds > 0 ? sample_bytes_ / microseconds : 0.0;
  // This collective opens the next sample.
  sample_start_ = now;
  sample_bytes_ = bytes;
  completions_.clear();
  for (const std::string& name : names) completions_[name] = 1;
  std::optional<TunedParameters> next = finish_sample(score);
  if (next) waiting_ = true;
  return next;
}

std::optional<TunedParameters> Autotuner::finish_sample(double score) {
  if (warmups_left_ > 0) {
    if (--warmups_left_ > 0) return std::nullopt;
    return next_trial();  // warmed up: the first trial starts
  }
  trial_scores_.push_back(score);
  if (static_cast<int>(trial_scores_.size()) < options_.samples_per_trial) return std::nullopt;
  const double trial = median(trial_scores_);
  trial_scores_.clear();
  log(current_, trial);
  if (trial > best_score_) {
    best_score_ = trial;
    best_ = current_;
  }
  ++candidate_;
  return next_trial();
}

std::optional<TunedParameters> Autotuner::next_trial() {
  while (stage_ < stage_names_.size()) {
    if (candidates_.empty()) {  // the stage begins: its candidates, the others at their best so far
      const std::string stage = stage_names_[stage_];
      candidate_ = 0;
      if (stage == "fusion_threshold") {
        for (std::size_t bytes : kFusionThresholds) {
          candidates_.push_back(best_);
          candidates_.back().fusion_threshold_bytes = bytes;
        }
      } else if (stage == "cycle_time") {
        for (auto time : kCycleTimes) {
          candidates_.push_back(best_);
          candidates_.back().cycle_time = time;
        }
      } else {
        for (bool on : {true, false}) {
          candidates_.push_back(best_);
          (stage == "cache" ? candidates_.back().cache_enabled : candidates_.back().hierarchical_allreduce) = on;
        }
      }
    }
    if (candidate_ < candidates_.size()) {
      current_ = candidates_[candidate_];
      return current_;
    }
    candidates_.clear();
    ++stage_;
  }
  active_ = false;
  current_ = best_;
  log(best_, best_score_);
  return current_;
}

void Autotuner::log(const TunedParameters& parameters, double score) {
  char line[160];
  std::snprintf(line, sizeof line, "%d,%d,%d,%g,%g,%.9g\n", parameters.hierarchical_allreduce ? 1 : 0, 0,
                parameters.cache_enabled ? 1 : 0, parameters.cycle_time.count() / 1000.0,
                static_cast<double>(parameters.fusion_threshold_bytes) / kMiB, score);
  if (log_.is_open()) {
    log_ << line;
    log_.flush();
  }
}

}  // namespace hora
