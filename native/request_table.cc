#include "request_table.h"

#include <algorithm>
#include <cstdio>

namespace hora {
namespace {


std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

bool reduces(RequestKind kind) { return kind == RequestKind::kAllreduce || kind == RequestKind::kReducescatter; }

bool fusable(RequestKind kind) {
  return kind == RequestKind::kAllreduce || kind == RequestKind::kAllgather || kind == RequestKind::kReducescatter;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace

RequestTable::RequestTable(int world_size, std::size_t fusion_threshold_bytes)
    : world_size_(world_size), fusion_threshold_(fusion_threshold_bytes) {}

void RequestTable::add(int rank, Request request, Clock::time_point now) {
  if (request.kind == RequestKind::kJoin) {
    if (std::find(joined_.begin(), joined_.end(), rank) == joined_.end()) joined_.push_back(rank);
    return;
  }
  if (request.kind == RequestKind::kShutdown) {
    shutting_down_.insert(rank);
    return;
  }
  const std::string key = request_key(request.process_set, request.name);
  auto [at, inserted] = pending_.try_emplace(key);
  Pending& pending = at->second;
  if (inserted) {
    pending.by_rank.resize(world_size_);
    pending.first_seen = now;
    pending.last_reported = now;
    arrival_order_.push_back(key);
  }
  if (!pending.by_rank[rank]) ++pending.count;
  pending.by_rank[rank] = std::move(request);
}

std::optional<Response> RequestTable::check_and_build(const std::vector<int>& members, const Pending& pending,
                                                     const std::vector<int>& joined_absent) const {
  int first_rank = -1;
  for (int member : members) {
    if (pending.by_rank[member]) {
      first_rank = member;
      break;
    }
  }
  const Request& first = *pending.by_rank[first_rank];
  Response response = response_for(first);
  response.joined = joined_absent;
  TensorEntry tensor{first.name, first.shape, {}, first.group, first.group_size};

  // Error texts are built only when there is an error: this runs for every tensor of every cycle.
  auto what = [&] { return "hora." + to_string(first.kind) + " of tensor '" + first.name + "'"; };
  auto mismatch = [&](int rank, const std::string& field, const std::string& mine, const std::string& theirs) {
    response.error = what() + ": ranks disagree on the " + field + ": rank " + std::to_string(first_rank) + " has " +
                     mine + " but rank " + std::to_string(rank) + " has " + theirs +
                     ". Every rank must submit a tensor of the same name with matching arguments.";
  };
  for (int member : members) {
    if (!response.error.empty()) break;
    if (!pending.by_rank[member]) continue;
    const Request& other = *pending.by_rank[member];
    if (other.kind != first.kind) {
      mismatch(member, "operation", "hora." + to_string(first.kind), "hora." + to_string(other.kind));
    } else if (other.dtype != first.dtype && moves_data(first.kind)) {
      mismatch(member, "dtype", to_string(first.dtype), to_string(other.dtype));
    } else if (reduces(first.kind) && other.op != first.op) {
      mismatch(member, "reduction", to_string(first.op), to_string(other.op));
    } else if (reduces(first.kind) && other.prescale != first.prescale) {
      mismatch(member, "prescale factor", number(first.prescale), number(other.prescale));
    } else if (reduces(first.kind) && other.postscale != first.postscale) {
      mismatch(member, "postscale factor", number(first.postscale), number(other.postscale));
    } else if (other.root != first.root) {
      mismatch(member, "root rank", std::to_string(first.root), std::to_string(other.root));
    } else if (other.group != first.group || other.group_size != first.group_size) {
      mismatch(member, "group", "'" + first.group + "' of " + std::to_string(first.group_size),
               "'" + other.group + "' of " + std::to_string(other.group_size));
    } else if (other.ranks != first.ranks) {
      std::vector<int> mine(first.ranks.begin(), first.ranks.end());
      std::vector<int> theirs(other.ranks.begin(), other.ranks.end());
      mismatch(member, "ranks", "[" + rank_list(mine) + "]", "[" + rank_list(theirs) + "]");
    } else if (first.kind == RequestKind::kAllgather || first.kind == RequestKind::kAlltoall) {
      const bool same = other.shape.size() == first.shape.size() &&
                        std::equal(other.shape.begin() + (other.shape.empty() ? 0 : 1), other.shape.end(),
                                   first.shape.begin() + (first.shape.empty() ? 0 : 1));
      if (!same) {
        mismatch(member, "shape after the first dimension", "shape " + shape_text(first.shape),
                 "shape " + shape_text(other.shape));
      }
    } else if (other.shape != first.shape) {
      mismatch(member, "shape", "shape " + shape_text(first.shape), "shape " + shape_text(other.shape));
    }
  }
  // As in Horovod, only allreduce (and barrier) run while some ranks have
  // joined: a joined rank has no rows to gather, scatter or send.
  if (response.error.empty() && !joined_absent.empty() && moves_data(first.kind) &&
      first.kind != RequestKind::kAllreduce) {
    response.error = what() + ": " + to_string(first.kind) + " is not supported while ranks have joined (rank " +
                     rank_list(joined_absent) + " called hora.join()); only allreduce is, as in Horovod." +
                     (first.kind == RequestKind::kAllgather
                          ? " Pass sparse_as_dense=True to DistributedOptimizer if sparse gradients caused it."
                          : "");
  }
  if (response.error.empty() && first.kind == RequestKind::kBroadcast &&
      std::find(members.begin(), members.end(), first.root) == members.end()) {
    response.error = what() + ": root rank " + std::to_string(first.root) + " is not a member of process set " +
                     std::to_string(first.process_set) + " (ranks " + rank_list(members) + ").";
  }
  if (first.kind == RequestKind::kAllgather) {
    for (int member : members) tensor.first_dims.push_back(pending.by_rank[member] ? pending.by_rank[member]->shape[0] : 0);
  }
  response.tensors.push_back(std::move(tensor));
  return response;
}

bool RequestTable::add_agreed(const Response& response) {
  if (!joined_.empty() ||
      (!pending_.empty() && pending_.count(request_key(response.process_set, response.tensors.front().name)))) {
    return false;
  }
  agreed_.push_back(response);
  return true;
}

std::vector<Response> RequestTable::take_ready(const ProcessSets& sets) {
  std::vector<Response> failures, singles, grouped;
  // A ready response joins the singles, or its group (which goes out once complete).
  const auto place = [&](Response response) {
    const TensorEntry& tensor = response.tensors.front();
    if (tensor.group.empty()) {
      singles.push_back(std::move(response));
      return;
    }
    const std::string group = tensor.group;
    const int group_size = tensor.group_size;
    std::vector<Response>& ready = groups_[group];
    ready.push_back(std::move(response));
    if (static_cast<int>(ready.size()) >= group_size) {
      // A group is one unit: its tensors go out together, in the same
      // cycle, fused with each other only (by the rules of fuse(), so a
      // large member still runs alone, in place).
      for (Response& unit : fuse(std::move(ready))) grouped.push_back(std::move(unit));
      groups_.erase(group);
    }
  };
  for (Response& response : agreed_) place(std::move(response));
  agreed_.clear();
  std::vector<std::string> still_waiting;
  for (const std::string& key : arrival_order_) {
    Pending& pending = pending_[key];
    const Request* any = nullptr;
    for (const auto& request : pending.by_rank) {
      if (request) any = &*request;
      if (any) break;
    }
    const std::vector<int>* members = sets.find(any->process_set);
    if (members == nullptr) {
      Response failure = response_for(*any);
      failure.tensors.push_back(TensorEntry{any->name, any->shape, {}, any->group, any->group_size});
      failure.error = "hora." + to_string(any->kind) + " of tensor '" + any->name + "': process set " +
                      std::to_string(any->process_set) + " does not exist (it was removed).";
      failures.push_back(std::move(failure));
      pending_.erase(key);
      continue;
    }
    std::vector<int> joined_absent;
    if (any->process_set == 0) {
      for (int rank : joined_) {
        if (!pending.by_rank[rank]) joined_absent.push_back(rank);
      }
      std::sort(joined_absent.begin(), joined_absent.end());
    }
    if (pending.count + joined_absent.size() < members->size()) {
      still_waiting.push_back(key);
      continue;
    }
    Response response = *check_and_build(*members, pending, joined_absent);
    pending_.erase(key);
    if (!response.error.empty()) {
      failures.push_back(std::move(response));
    } else {
      place(std::move(response));
    }
  }
  arrival_order_ = std::move(still_waiting);

  std::vector<Response> ready = fuse(std::move(singles));
  ready.insert(ready.begin(), std::make_move_iterator(failures.begin()), std::make_move_iterator(failures.end()));
  ready.insert(ready.end(), std::make_move_iterator(grouped.begin()), std::make_move_iterator(grouped.end()));
  if (static_cast<int>(joined_.size()) == world_size_) {
    Response join;
    join.kind = RequestKind::kJoin;
    join.last_joined = joined_.back();
    ready.push_back(std::move(join));
    joined_.clear();
  }
  if (!shutting_down_.empty()) {
    // One rank leaving ends the job for all, as in Horovod: the others'
    // later requests could never complete without it.
    Response shutdown;
    shutdown.kind = RequestKind::kShutdown;
    shutdown.ranks.assign(shutting_down_.begin(), shutting_down_.end());
    ready.push_back(std::move(shutdown));
    shutting_down_.clear();
  }
  return ready;
}

// Greedy first fit, keeping the order of first appearance: each tensor goes
// into the first open buffer with the same parameters that has room.
// Fusion saves a tensor its own collective (tens of microseconds of
// latency) and costs it two copies, into the fusion buffer and out; from a
// few hundred KiB the copies cost more (a 256 KiB tensor: ~50 us of copies
// at this machine's 10 GB/s against ~25 us saved). A tensor this large runs
// alone, in place.
constexpr std::size_t kRunsAloneBytes = 256 * 1024;

std::vector<Response> RequestTable::fuse(std::vector<Response> ready) const {
  if (ready.size() < 2) return ready;
  std::vector<Response> out;
  std::vector<std::size_t> bytes;
  std::vector<bool> open;  // whether out[i] may take more tensors
  for (Response& response : ready) {
    const std::size_t size = response_bytes(response);
    const bool fuses = fusable(response.kind) && fusion_threshold_ > 0 && size < kRunsAloneBytes;
    bool placed = false;
    for (std::size_t i = 0; fuses && i < out.size(); ++i) {
      if (open[i] && same_parameters(out[i], response) && bytes[i] + size <= fusion_threshold_) {
        out[i].tensors.push_back(std::move(response.tensors.front()));
        bytes[i] += size;
        placed = true;
        break;
      }
    }
    if (!placed) {
      out.push_back(std::move(response));
      bytes.push_back(size);
      open.push_back(fuses);
    }
  }
  return out;
}

std::string RequestTable::describe_waiting(const Pending& pending, Clock::time_point now,
                                          const ProcessSets& sets) const {
  const Request* any = nullptr;
  std::vector<int> have, missing;
  for (int rank = 0; rank < world_size_; ++rank) {
    if (pending.by_rank[rank]) {
      have.push_back(rank);
      if (!any) any = &*pending.by_rank[rank];
    }
  }
  const std::vector<int>* members = sets.find(any->process_set);
  for (int rank : members ? *members : std::vector<int>{}) {
    const bool joined = any->process_set == 0 && std::find(joined_.begin(), joined_.end(), rank) != joined_.end();
    if (!pending.by_rank[rank] && !joined) missing.push_back(rank);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - pending.first_seen).count();
  std::string text = "tensor '" + any->name + "' (" + to_string(any->kind);
  if (any->process_set != 0) text += ", process set " + std::to_string(any->process_set);
  return text + ") submitted by ranks " + rank_list(have) + " has waited " + std::to_string(waited) +
         " s for ranks " + rank_list(missing);
}

std::string RequestTable::stall_report(Clock::time_point now, std::chrono::milliseconds after,
                                      const ProcessSets& sets) {
  std::string report;
  for (const std::string& key : arrival_order_) {
    Pending& pending = pending_[key];
    if (now - pending.first_seen < after || now - pending.last_reported < after) continue;
    report += (report.empty() ? "" : "\n") + describe_waiting(pending, now, sets);
    pending.last_reported = now;
  }
  return report;
}

std::string RequestTable::stalled_longer_than(Clock::time_point now, std::chrono::milliseconds after,
                                             const ProcessSets& sets) const {
  for (const std::string& key : arrival_order_) {
    const Pending& pending = pending_.at(key);
    if (now - pending.first_seen >= after) return describe_waiting(pending, now, sets);
  }
  return "";
}

std::optional<RequestTable::Clock::time_point> RequestTable::next_stall_check(std::chrono::milliseconds after) const {
  std::optional<Clock::time_point> next;
  for (const std::string& key : arrival_order_) {
    const Pending& pending = pending_.at(key);
    const Clock::time_point due = std::max(pending.first_seen, pending.last_reported) + after;
    if (!next || due < *next) next = due;
  }
  return next;
}

}  // namespace hora
