// The cycle protocol.
//
// There is no coordinator process: every rank holds the same table of
// outstanding requests (request_table.h) and computes the same responses from
// it. Ranks do not run in lockstep: a cycle happens only when something
// changed, so an idle job sleeps in poll() (wait_incoming) instead of
// exchanging messages every millisecond. A cycle is:
//
//   1. A rank that has new requests (submissions paused for the cycle time,
//      or a thread waits on a handle), or that receives another rank's
//      cycle message, sends its cycle message to every other rank: its new
//      requests (possibly none), and the reason when it stops the job.
//      Every rank sends exactly one message to every other rank per cycle.
//   2. Requests that hit the response cache travel as bits of a bit vector,
//      the rest in full. In the steady state (the same tensors every step) a
//      cycle is one exchange of bit vectors, with no round trip through a
//      coordinator; a tensor whose bit came from every member of its process
//      set in this cycle is agreed at once, its cached response being the
//      response (RequestTable::add_agreed), without rebuilding and checking
//      every rank's request in the table.
//   3. Each rank adds every rank's requests to its table in rank order (but
//      for the agreed ones above), takes the requests that are now ready on
//      every member of their process set, checks that the members agree and
//      fuses them with the agreed ones: the same
//      responses, in the same order, on every rank. It updates its response
//      cache and process set table, and executes each collective of a set it
//      belongs to. Collectives of different process sets share the
//      connections safely because every rank meets them in this one order.
//
// Who runs the cycles, the engine's background thread or a waiting caller,
// is in engine_progress.cc.
//
// On each connection the cycle messages come before the collective data of
// that cycle, and the next cycle's message only after it, so control
// messages and data never interleave. A message travels as one frame of
// kFrameBytes, an 8-byte length and the start of the message, and whatever
// does not fit follows as a second transfer: in the steady state (a few
// cache bits) a message is one transfer. A job of n ranks sends n(n-1) small
// messages per cycle, which suits the tens of ranks Hora runs on; a tree
// would take over beyond that.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "engine.h"
#include "errors.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kCycleMessage = 0x48;  // 'H': a cheap check that the ranks are in step

// The first transfer of every cycle message: its length, then its first
// kFrameBytes - 8 bytes.
constexpr std::size_t kFrameBytes = 256;
constexpr std::size_t kFramePayload = kFrameBytes - sizeof(uint64_t);

// "NEGOTIATE_ALLREDUCE": the timeline's name for waiting on the other ranks.
std::string negotiate_activity(RequestKind kind) {
  std::string name = "NEGOTIATE_" + to_string(kind);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

void Engine::receive_message(int peer, std::vector<char>& body) {
  char frame[kFrameBytes];
  transport_->wait(transport_->recv(peer, frame, sizeof frame));
  uint64_t length = 0;
  std::memcpy(&length, frame, sizeof length);
  if (length > (uint64_t{1} << 32)) {
    throw HoraInternalError("Rank " + std::to_string(rank_) + " received an engine message of " +
                            std::to_string(length) + " bytes from rank " + std::to_string(peer) +
                            "; the ranks are out of step.");
  }
  const std::size_t inline_bytes = std::min<std::size_t>(length, kFramePayload);
  body.assign(frame + sizeof length, frame + sizeof length + inline_bytes);
  if (length > inline_bytes) {
    body.resize(length);
    transport_->wait(transport_->recv(peer, body.data() + inline_bytes, length - inline_bytes));
  }
}

void Engine::run_cycle() {
  ++cycle_;
  const Clock::time_point now = Clock::now();
  timeline_.mark_cycle(now);
  std::vector<Submission>& fresh = scratch_.fresh;
  take_queue(fresh);
  for (const Submission& submission : fresh) {
    if (timeline_.active() && moves_data(submission.request.kind)) {
      timeline_.begin(submission.request.name, negotiate_activity(submission.request.kind), submission.submitted);
    }
  }
  // Decide now whether this rank stops the job, so the others learn why.
  std::string abort_reason;
  if (options_.stall_shutdown.count() > 0) {
    const std::string stalled = table_.stalled_longer_than(now, options_.stall_shutdown, sets_);
    if (!stalled.empty()) {
      abort_reason = "Hora stopped the job: " + stalled + ", longer than the stall shutdown time of " +
                     seconds_text(options_.stall_shutdown) + ".";
    }
  }
  messages_.resize(size_);
  std::vector<char>& mine = messages_[rank_];
  encode_message(fresh, abort_reason, mine);
  for (Submission& submission : fresh) {
    std::string key = std::move(submission.key);  // the map's key from here on
    pending_.emplace(std::move(key), std::move(submission));
  }
  fresh.clear();

  // Post every send before waiting on any receive: every rank sends to every
  // other at once, so waiting for a send first could wait on a peer that is
  // itself waiting.
  const uint64_t length = mine.size();
  const std::size_t inline_bytes = std::min<std::size_t>(length, kFramePayload);
  char frame[kFrameBytes] = {};
  std::memcpy(frame, &length, sizeof length);
  std::memcpy(frame + sizeof length, mine.data(), inline_bytes);
  std::vector<Handle>& sends = scratch_.sends;
  sends.clear();
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    sends.push_back(transport_->send(peer, frame, sizeof frame));
    if (length > inline_bytes) sends.push_back(transport_->send(peer, mine.data() + inline_bytes, length - inline_bytes));
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) receive_message(peer, messages_[peer]);
  }
  for (const Handle& handle : sends) transport_->wait(handle);

  const Clock::time_point received = Clock::now();
  // Every message's cache slots first: whether all members of a tensor's set announced it decides how it is added.
  std::vector<Reader>& readers = scratch_.readers;
  readers.clear();
  announced_.resize(size_);
  for (int from = 0; from < size_; ++from) {
    readers.push_back(open_message(from, messages_[from], abort_reason));
    readers.back().get_vector(scratch_.bits);
    from_bits(scratch_.bits, announced_[from]);
  }
  if (!abort_reason.empty()) throw HoraError(abort_reason);
  count_announcements();
  for (int from = 0; from < size_; ++from) decode_message(from, readers[from], received);
  for (const std::vector<int>& slots : announced_) {
    for (int slot : slots) announcements_[slot] = 0;
  }
  std::vector<Response> responses = table_.take_ready(sets_);
  if (options_.stall_warning.count() > 0) {
    const std::string stall = table_.stall_report(received, options_.stall_warning, sets_);
    if (!stall.empty()) log_line("WARNING: stalled requests:\n" + stall);
  }
  apply(responses);
}

void Engine::encode_message(const std::vector<Submission>& fresh, const std::string& abort_reason,
                            std::vector<char>& message) {
  std::vector<int>& slots = scratch_.slots;
  std::vector<const Request*>& full = scratch_.full;
  slots.clear();
  full.clear();
  for (const Submission& submission : fresh) {
    const Request& request = submission.request;
    const int member = sets_.member_index(request.process_set, rank_);
    const int slot = cache_enabled_ && moves_data(request.kind) ? cache_.lookup(request, submission.key, member) : -1;
    if (slot >= 0) {
      slots.push_back(slot);
    } else {
      full.push_back(&request);
    }
  }
  Writer out(std::move(message));
  out.put<uint8_t>(kCycleMessage);
  out.put<uint64_t>(cycle_);
  out.put_string(abort_reason);
  to_bits(slots, scratch_.bits);
  out.put_vector(scratch_.bits);
  out.put<uint32_t>(static_cast<uint32_t>(full.size()));
  for (const Request* request : full) write_request(out, *request);
  // Rank 0's tuned parameters, in force from this cycle on every rank.
  out.put<uint8_t>(announce_ ? 1 : 0);
  if (announce_) {
    out.put<uint64_t>(announce_->fusion_threshold_bytes);
    out.put<int64_t>(announce_->cycle_time.count());
    out.put<uint8_t>(announce_->cache_enabled ? 1 : 0);
    out.put<uint8_t>(announce_->hierarchical_allreduce ? 1 : 0);
    announce_.reset();
  }
  message = std::move(out.data());
}

Reader Engine::open_message(int from, const std::vector<char>& message, std::string& abort_reason) const {
  Reader in(message.data(), message.size());
  if (in.get<uint8_t>() != kCycleMessage || in.get<uint64_t>() != cycle_) {
    throw HoraInternalError("Rank " + std::to_string(rank_) + " received an engine message out of step from rank " +
                            std::to_string(from) + ".");
  }
  std::string reason = in.get_string();
  if (abort_reason.empty()) abort_reason = std::move(reason);
  return in;
}

void Engine::count_announcements() {
  announcements_.resize(cache_.capacity());
  for (int from = 0; from < size_; ++from) {
    for (int slot : announced_[from]) {
      if (sets_.member_index(cache_.at(slot).process_set, from) >= 0) ++announcements_.at(slot);
    }
  }
}

void Engine::decode_message(int from, Reader& in, Clock::time_point now) {
  for (int slot : announced_[from]) {
    int& count = announcements_[slot];
    if (count < 0) continue;  // agreed already
    const Response& cached = cache_.at(slot);
    const std::vector<int>* members = sets_.find(cached.process_set);
    // Every member announced the cached tensor: the cached response is the response (the table would rebuild it).
    if (members != nullptr && count == static_cast<int>(members->size()) && table_.add_agreed(cached)) {
      count = -1;
      agreed_from_cache_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    table_.add(from, cache_.request_for(slot, sets_.member_index(cached.process_set, from)), now);
  }
  const uint32_t count = in.get<uint32_t>();
  for (uint32_t i = 0; i < count; ++i) table_.add(from, read_request(in), now);
  if (in.get<uint8_t>() != 0) {
    TunedParameters tuned;
    tuned.fusion_threshold_bytes = in.get<uint64_t>();
    tuned.cycle_time = std::chrono::microseconds(in.get<int64_t>());
    tuned.cache_enabled = in.get<uint8_t>() != 0;
    tuned.hierarchical_allreduce = in.get<uint8_t>() != 0;
    if (from == 0) use_parameters(tuned);
  }
}

void Engine::use_parameters(const TunedParameters& parameters) {
  table_.set_fusion_threshold(parameters.fusion_threshold_bytes);
  cycle_time_us_ = parameters.cycle_time.count();
  cache_enabled_ = parameters.cache_enabled;
  executor_.enable_hierarchy(parameters.hierarchical_allreduce);
  autotuner_->applied();
  std::lock_guard<std::mutex> lock(mutex_);
  parameters_ = parameters;
  parameters_.hierarchical_allreduce = parameters.hierarchical_allreduce && executor_.hierarchical();
}

void Engine::apply(const std::vector<Response>& responses) {
  for (const Response& response : responses) {
    cache_.update(response);
    // This rank's submission of a tensor of the response, if it made one.
    auto local = [&](const std::string& name) {
      return pending_.find(assign_request_key(scratch_.key, response.process_set, name));
    };
    std::vector<std::pair<int64_t, Result>>& completed = scratch_.completed;
    auto finish = [&](const std::string& name, Result result) {
      const auto found = local(name);
      if (found == pending_.end()) return;
      completed.emplace_back(found->second.handle, std::move(result));
      pending_.erase(found);
      complete(completed);
    };
    if (!response.error.empty()) {
      const Clock::time_point refused = Clock::now();
      for (const TensorEntry& tensor : response.tensors) {
        const auto found = local(tensor.name);
        if (found == pending_.end()) continue;
        // Its negotiation ends here (this rank opened it for its own request's kind): the next request of
        // this name opens a span of its own.
        if (moves_data(found->second.request.kind)) timeline_.end(tensor.name, refused);
        const int64_t handle = found->second.handle;
        pending_.erase(found);
        fail(handle, std::make_exception_ptr(RequestError(response.error)));
      }
      continue;
    }
    switch (response.kind) {
      case RequestKind::kJoin: {
        Result result;
        result.value = response.last_joined;
        finish("join", result);
        continue;
      }
      case RequestKind::kShutdown: {
        std::string who;
        bool by_peers = true;
        for (int rank : response.ranks) {
          who += (who.empty() ? "" : ", ") + std::to_string(rank);
          by_peers = by_peers && rank != rank_;
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          shutdown_reason_ = "Hora shut down (rank " + who + " called hora.shutdown() or exited)";
          shutdown_by_peers_ = by_peers;
        }
        finish("shutdown", Result{});
        finished_ = true;
        continue;
      }
      case RequestKind::kAddProcessSet: {
        std::vector<int> members(response.ranks.begin(), response.ranks.end());
        Result result;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          result.value = sets_.add(members);
        }
        finish(response.tensors.front().name, result);
        continue;
      }
      case RequestKind::kRemoveProcessSet: {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          sets_.remove(response.ranks.empty() ? -1 : response.ranks.front());
        }
        finish(response.tensors.front().name, Result{});
        continue;
      }
      default: break;
    }
    const std::vector<int>* members = sets_.find(response.process_set);
    if (members == nullptr || sets_.member_index(response.process_set, rank_) < 0) continue;
    std::vector<PendingMap::iterator>& found = scratch_.found;
    std::vector<const Submission*>& mine = scratch_.mine;
    found.clear();
    mine.clear();
    const bool timed = timeline_.active();
    const Clock::time_point now = timed ? Clock::now() : Clock::time_point{};
    for (const TensorEntry& tensor : response.tensors) {
      found.push_back(local(tensor.name));
      mine.push_back(found.back() == pending_.end() ? nullptr : &found.back()->second);
      if (timed && mine.back() != nullptr && moves_data(response.kind)) timeline_.end(tensor.name, now);
    }
    std::vector<Result>& results = scratch_.results;
    executor_.execute(response, mine, *members, results);
    if (autotuner_->active()) {
      std::vector<std::string> keys;
      for (const TensorEntry& tensor : response.tensors) keys.push_back(request_key(response.process_set, tensor.name));
      if (auto tuned = autotuner_->record(keys, response_bytes(response), Clock::now())) announce_ = tuned;
    }
    // Complete the whole response under one lock, waking the waiting threads once.
    for (std::size_t i = 0; i < response.tensors.size(); ++i) {
      if (mine[i] == nullptr) continue;
      completed.emplace_back(mine[i]->handle, std::move(results[i]));
      pending_.erase(found[i]);
    }
    complete(completed);
  }
}

}  // namespace hora
