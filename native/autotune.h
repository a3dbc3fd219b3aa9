// Online tuning of the engine's parameters, as Horovod's autotuner
// (HOROVOD_AUTOTUNE) does it: from the job's measured throughput.
//
// A sample is `steps_per_sample` training steps (a step ends when a tensor
// completes again), and its score is the bytes of the tensors completed in
// it per microsecond of wall time: with the same tensors every step, a
// higher score is a shorter step. Rank 0 tunes. After `warmup_samples`
// samples it tries the candidates of each parameter in turn (the fusion
// threshold, then the cycle time, the response cache, and hierarchical
// allreduce where the placement allows it), `samples_per_trial` samples
// each, scored by their median; it keeps each parameter's best value before
// it moves to the next, and stops with the best of all. Every trial and the
// final choice are written to the log file as CSV, in the columns of
// Horovod's autotune log. Parameters the user set explicitly are not tuned.
//
// Rank 0's choices reach the other ranks in its cycle messages (engine_cycle.cc),
// so that every rank switches at the same cycle: the ranks must agree on
// the fusion threshold and on whether a request may travel as a cache bit.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace hora {

struct TunedParameters {
  std::size_t fusion_threshold_bytes = 0;
  std::chrono::microseconds cycle_time{0};
  bool cache_enabled = true;
  bool hierarchical_allreduce = false;

  bool operator==(const TunedParameters& other) const {
    return fusion_threshold_bytes == other.fusion_threshold_bytes && cycle_time == other.cycle_time &&
           cache_enabled == other.cache_enabled && hierarchical_allreduce == other.hierarchical_allreduce;
  }
};

struct AutotuneOptions {
  bool enabled = false;
  std::string log_path;  // empty: no log file
  int warmup_samples = 3;
  int steps_per_sample = 10;
  int samples_per_trial = 3;
  // Set by the user: kept as they are. (Horovod warms up 3 samples of 10 steps.)
  bool fusion_threshold_fixed = false;
  bool cycle_time_fixed = false;
  bool cache_fixed = false;
  bool hierarchical_fixed = false;
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // `hierarchical_possible`: whether the placement allows hierarchical allreduce.
  Autotuner(AutotuneOptions options, TunedParameters initial, bool hierarchical_possible);

  // Whether it is still tuning.
  bool active() const { return active_; }
  const TunedParameters& current() const { return current_; }

  // Records the tensors of one executed collective (`keys`: "<set>:<name>",
  // `bytes` in all) at `now`. Returns the parameters of the next trial (or
  // the final ones) when they change; until they are in force (applied()),
  // nothing more is recorded, so that every sample measures the parameters
  // it is scored for.
  std::optional<TunedParameters> record(const std::vector<std::string>& keys, std::size_t bytes,
                                        Clock::time_point now);
  // The parameters last returned by record() are in force from now on.
  void applied();

 private:
  void plan(bool hierarchical_possible);
  std::optional<TunedParameters> finish_sample(double score);
  // The parameters of the next trial: the next candidate of this stage, the
  // first of the next stage, or, once every stage is done, the best (final).
  std::optional<TunedParameters> next_trial();
  void log(const TunedParameters& parameters, double score);

  AutotuneOptions options_;
  TunedParameters current_;
  TunedParameters best_;
  double best_score_ = -1.0;
  bool active_;
  std::ofstream log_;

  std::vector<const char*> stage_names_;
  std::size_t stage_ = 0;      // the parameter being tuned
  std::size_t candidate_ = 0;  // its candidate being tried
  std::vector<TunedParameters> candidates_;
  std::vector<double> trial_scores_;  // the samples of the current trial
  int warmups_left_;

  // The sample being measured.
  bool waiting_ = false;  // for the parameters last returned to be applied
  bool sampling_ = false;
  Clock::time_point sample_start_{};
  std::size_t sample_bytes_ = 0;
  std::unordered_map<std::string, int> completions_;
};

}  // namespace hora
