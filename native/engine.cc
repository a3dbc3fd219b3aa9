// The cycle protocol.
//
// Rank 0 coordinates. Ranks do not run in lockstep: a cycle happens only
// when something changed, so an idle job sleeps in poll() (wait_incoming)
// instead of exchanging messages every millisecond. A cycle is:
//
//   1. A worker that has new requests (its cycle time passed, or a thread
//      waits on a handle) sends them to rank 0 unprompted. Rank 0, when it
//      has new requests itself or receives a worker's, sends Start to every
//      worker it has not yet heard from in this cycle; each of them answers
//      with its new requests (possibly none). Every worker sends exactly one
//      Requests message per cycle; one that was about to send anyway
//      ignores the Start that crossed its message.
//   2. Requests that hit the response cache travel as bits of a bit vector;
//      the rest in full. Rank 0 adds them to its table (coordinator.h),
//      takes the requests that are now ready on every member of their
//      process set, checks that the members agree, fuses them, and sends
//      the list of responses to every worker.
//   3. Every rank applies the same responses in the same order: it updates
//      its response cache and process set table, and executes each
//      collective of a set it belongs to. Collectives of different process
//      sets share the connections safely because every rank meets them in
//      this one order.
//
// On each connection between a worker and rank 0 the messages of one cycle
// come before any collective data of that cycle, and a worker's next
// Requests message only after it, so control messages and data never
// interleave. Messages are framed by an 8-byte length.
#include "engine.h"

#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "errors.h"
#include "reduce.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class MessageType : uint8_t { kStart = 1, kRequests = 2, kResponses = 3 };

constexpr milliseconds kIdlePoll{1000};

// How long the engine thread and a waiting caller poll before they block: a
// blocked thread takes tens of microseconds to wake, and in a training loop
// the next message or completion usually comes sooner than that. Bounded,
// so an idle job sleeps.
constexpr std::chrono::microseconds kSpin{50};

constexpr int kBurstCycles = 5;

std::string key_of(const Request& request) { return std::to_string(request.process_set) + ":" + request.name; }

// "NEGOTIATE_ALLREDUCE": the timeline's name for waiting on the other ranks.
std::string negotiate_activity(RequestKind kind) {
  std::string name = "NEGOTIATE_" + to_string(kind);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void log_line(int rank, const std::string& text) {
  std::fprintf(stderr, "[hora rank %d] %s\n", rank, text.c_str());
  std::fflush(stderr);
}

}  // namespace

Engine::Engine(std::shared_ptr<Transport> transport, EngineOptions options)
    : transport_(std::move(transport)),
      options_(options),
      rank_(transport_->rank()),
      size_(transport_->size()),
      sets_(size_),
      cache_(options.cache_capacity),
      executor_(*transport_, timeline_) {
  if (rank_ == 0) coordinator_ = std::make_unique<Coordinator>(size_, options.fusion_threshold_bytes);
  next_stall_check_ = Clock::now() + options_.stall_warning;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  transport_->wake();
  if (thread_.joinable()) thread_.join();
}

std::vector<int> Engine::process_set(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<int>* members = sets_.find(id);
  return members ? *members : std::vector<int>{};
}

std::vector<int> Engine::process_set_ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_.ids();
}

int64_t Engine::submit(Submission submission) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (stopped_ || stop_) throw HoraError(shutdown_reason_ + "; no more requests can run on this rank.");
  const Request& request = submission.request;
  const std::vector<int>* members = sets_.find(request.process_set);
  if (members == nullptr) {
    throw std::invalid_argument("Process set " + std::to_string(request.process_set) +
                                " does not exist; add it with hora.add_process_set() first.");
  }
  if (sets_.member_index(request.process_set, rank_) < 0) {
    throw std::invalid_argument("Rank " + std::to_string(rank_) + " is not a member of process set " +
                                std::to_string(request.process_set) + "; only its members may call collectives on it.");
  }
  if (request.kind == RequestKind::kAllreduce || request.kind == RequestKind::kReducescatter) {
    check_reduction(request.dtype, request.op);
    if (request.dtype == DataType::kBool && (request.prescale != 1.0 || request.postscale != 1.0)) {
      throw std::invalid_argument("Scale factors are not defined for bool tensors; got prescale " +
                                  std::to_string(request.prescale) + " and postscale " +
                                  std::to_string(request.postscale) + ".");
    }
  }
  const std::string key = key_of(request);
  if (!in_flight_.insert(key).second) {
    throw std::invalid_argument("A request named '" + request.name + "' is already in flight on rank " +
                                std::to_string(rank_) + "; wait for it before submitting another with that name, "
                                "or give each tensor its own name.");
  }
  const int64_t handle = next_handle_++;
  handles_[handle].key = key;
  submission.handle = handle;
  submission.submitted = Clock::now();
  const bool was_empty = queue_.empty();
  queue_.push_back(std::move(submission));
  lock.unlock();
  if (was_empty || flush_) transport_->wake();
  return handle;
}

bool Engine::poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = handles_.find(handle);
  if (found == handles_.end()) throw std::invalid_argument("Unknown handle " + std::to_string(handle) + ".");
  return found->second.done;
}

Result Engine::wait(int64_t handle, const std::function<void()>& between_slices) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = handles_.find(handle);
  if (found == handles_.end()) {
    throw std::invalid_argument("Unknown handle " + std::to_string(handle) + "; it was already synchronized.");
  }
  if (!found->second.done) {
    // The caller blocks, so nothing more will come from this thread: start
    // the cycle now rather than at the end of the cycle time.
    flush_ = true;
    lock.unlock();
    transport_->wake();
    const Clock::time_point spin_until = Clock::now() + kSpin;
    lock.lock();
    while (!handles_.at(handle).done && Clock::now() < spin_until) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    constexpr milliseconds kSlice{100};
    while (!done_cv_.wait_for(lock, kSlice, [&] { return handles_.at(handle).done; })) {
      if (between_slices) {
        lock.unlock();
        between_slices();  // may throw (an interrupted caller); the request stays in flight
        lock.lock();
      }
    }
    found = handles_.find(handle);
  }
  HandleState state = std::move(found->second);
  handles_.erase(found);
  if (state.error) std::rethrow_exception(state.error);
  return std::move(state.result);
}

void Engine::shutdown() {
  if (!thread_.joinable()) return;
  bool agreed = false;
  try {
    Submission request;
    request.request.kind = RequestKind::kShutdown;
    request.request.name = "shutdown";
    const int64_t handle = submit(std::move(request));
    std::unique_lock<std::mutex> lock(mutex_);
    flush_ = true;
    transport_->wake();
    agreed = done_cv_.wait_for(lock, options_.shutdown_timeout, [&] { return handles_.at(handle).done; });
  } catch (const std::exception&) {
    // Already failed or stopped: nothing to agree on.
  }
  if (!agreed) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_ && !stopped_) {
      log_line(rank_, "shutdown: rank 0 did not confirm the shutdown within " +
                          seconds_text(options_.shutdown_timeout) + "; leaving anyway.");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  transport_->wake();
  thread_.join();
  timeline_.stop();
}

void Engine::loop() {
  try {
    while (!finished_) {
      const bool prompted = wait_for_cycle();
      if (finished_) break;
      run_cycle(prompted);
    }
  } catch (const std::exception& error) {
    transport_->abort(error.what());
    fail_everything(std::current_exception());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  for (auto& [id, state] : handles_) {
    if (!state.done) {
      state.done = true;
      state.error = failure_ ? failure_ : std::make_exception_ptr(HoraError(shutdown_reason_ + " before this request completed."));
    }
  }
  done_cv_.notify_all();
}

bool Engine::local_ready(Clock::time_point now, milliseconds* wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) {
    finished_ = true;
    return true;
  }
  *wait = kIdlePoll;
  if (queue_.empty()) return false;
  // A burst of submissions (a framework's backward pass) goes out together:
  // the cycle starts once submissions pause for the cycle time, or at the
  // latest kBurstCycles cycle times after the first of them.
  const auto quiet = now - queue_.back().submitted;
  const auto waited = now - queue_.front().submitted;
  const auto longest = options_.cycle_time * kBurstCycles;
  if (flush_ || quiet >= options_.cycle_time || waited >= longest) return true;
  const auto left = std::min<Clock::duration>(options_.cycle_time - quiet, longest - waited);
  *wait = std::chrono::duration_cast<milliseconds>(left) + milliseconds(1);
  return false;
}

bool Engine::wait_for_cycle() {
  std::vector<int> peers;
  if (rank_ == 0) {
    for (int worker = 1; worker < size_; ++worker) peers.push_back(worker);
  } else {
    peers.push_back(0);
  }
  const Clock::time_point spin_until = Clock::now() + kSpin;
  for (;;) {
    const Clock::time_point now = Clock::now();
    milliseconds wait{0};
    if (local_ready(now, &wait)) return false;
    for (int peer : peers) {
      if (transport_->incoming(peer)) return rank_ != 0;
    }
    if (rank_ == 0 && options_.stall_warning.count() > 0) {
      const auto due = coordinator_->next_stall_check(options_.stall_warning);
      if (due && *due <= now) return false;
      if (due) wait = std::min(wait, std::chrono::duration_cast<milliseconds>(*due - now) + milliseconds(1));
    }
    if (rank_ == 0 && options_.stall_shutdown.count() > 0) {
      const auto due = coordinator_->next_stall_check(options_.stall_shutdown);
      if (due && *due <= now) return false;
    }
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    transport_->wait_incoming(peers, wait);
  }
}

std::vector<Submission> Engine::take_queue() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Submission> fresh(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  flush_ = false;
  return fresh;
}

void Engine::send_message(int peer, const std::vector<char>& body) {
  const uint64_t length = body.size();
  const Handle header = transport_->send(peer, &length, sizeof length);
  const Handle payload = transport_->send(peer, body.data(), body.size());
  transport_->wait(header);
  transport_->wait(payload);
}

std::vector<char> Engine::receive_message(int peer) {
  uint64_t length = 0;
  transport_->wait(transport_->recv(peer, &length, sizeof length));
  if (length > (uint64_t{1} << 32)) {
    throw HoraInternalError("Rank " + std::to_string(rank_) + " received an engine message of " +
                            std::to_string(length) + " bytes from rank " + std::to_string(peer) +
                            "; the ranks are out of step.");
  }
  std::vector<char> body(length);
  transport_->wait(transport_->recv(peer, body.data(), body.size()));
  return body;
}

void Engine::run_cycle(bool prompted) {
  ++cycle_;
  timeline_.mark_cycle(Clock::now());
  std::vector<Submission> fresh = take_queue();
  for (const Submission& submission : fresh) {
    if (timeline_.active() && moves_data(submission.request.kind)) {
      timeline_.begin(submission.request.name, negotiate_activity(submission.request.kind), submission.submitted);
    }
  }
  if (rank_ == 0) {
    coordinate(fresh);
    return;
  }
  if (prompted) {
    const std::vector<char> start = receive_message(0);
    if (start.empty() || static_cast<MessageType>(start[0]) != MessageType::kStart) {
      throw HoraInternalError("Rank " + std::to_string(rank_) + " expected a cycle start from rank 0.");
    }
  }
  send_message(0, encode_requests(fresh));
  for (Submission& submission : fresh) {
    const std::string key = key_of(submission.request);
    pending_.emplace(key, std::move(submission));
  }
  for (;;) {
    const std::vector<char> message = receive_message(0);
    if (!message.empty() && static_cast<MessageType>(message[0]) == MessageType::kStart) continue;
    std::string stall, abort_reason;
    std::vector<Response> responses = decode_responses(message, &stall, &abort_reason);
    if (!stall.empty()) log_line(rank_, "WARNING: stalled requests (reported by rank 0):\n" + stall);
    if (!abort_reason.empty()) throw HoraError(abort_reason);
    apply(responses);
    return;
  }
}

void Engine::coordinate(std::vector<Submission>& fresh) {
  const Clock::time_point now = Clock::now();
  for (Submission& submission : fresh) {
    coordinator_->add(0, submission.request, now);
    const std::string key = key_of(submission.request);
    pending_.emplace(key, std::move(submission));
  }
  std::vector<int> unheard;
  Writer start;
  start.put<MessageType>(MessageType::kStart);
  start.put<uint64_t>(cycle_);
  for (int worker = 1; worker < size_; ++worker) {
    if (transport_->incoming(worker)) {
      decode_requests(worker, receive_message(worker));
    } else {
      send_message(worker, start.data());
      unheard.push_back(worker);
    }
  }
  for (int worker : unheard) decode_requests(worker, receive_message(worker));

  std::vector<Response> responses = coordinator_->take_ready(sets_);
  const Clock::time_point after = Clock::now();
  std::string stall;
  if (options_.stall_warning.count() > 0) {
    stall = coordinator_->stall_report(after, options_.stall_warning, sets_);
    if (!stall.empty()) log_line(rank_, "WARNING: stalled requests:\n" + stall);
  }
  std::string abort_reason;
  if (options_.stall_shutdown.count() > 0) {
    const std::string stalled = coordinator_->stalled_longer_than(after, options_.stall_shutdown, sets_);
    if (!stalled.empty()) {
      abort_reason = "Hora stopped the job: " + stalled + ", longer than the stall shutdown time of " +
                     seconds_text(options_.stall_shutdown) + ".";
    }
  }
  const std::vector<char> message = encode_responses(responses, stall, abort_reason);
  std::vector<Handle> sends;
  const uint64_t length = message.size();
  for (int worker = 1; worker < size_; ++worker) {
    sends.push_back(transport_->send(worker, &length, sizeof length));
    sends.push_back(transport_->send(worker, message.data(), message.size()));
  }
  for (const Handle& handle : sends) transport_->wait(handle);
  if (!abort_reason.empty()) throw HoraError(abort_reason);
  apply(responses);
}

std::vector<char> Engine::encode_requests(const std::vector<Submission>& fresh) {
  std::vector<int> slots;
  std::vector<const Request*> full;
  for (const Submission& submission : fresh) {
    const Request& request = submission.request;
    const int member = sets_.member_index(request.process_set, rank_);
    const int slot = moves_data(request.kind) ? cache_.lookup(request, member) : -1;
    if (slot >= 0) {
      slots.push_back(slot);
    } else {
      full.push_back(&request);
    }
  }
  Writer out;
  out.put<MessageType>(MessageType::kRequests);
  out.put<uint64_t>(cycle_);
  out.put_vector(to_bits(slots));
  out.put<uint32_t>(static_cast<uint32_t>(full.size()));
  for (const Request* request : full) write_request(out, *request);
  return std::move(out.data());
}

void Engine::decode_requests(int from, const std::vector<char>& message) {
  Reader in(message.data(), message.size());
  if (in.get<MessageType>() != MessageType::kRequests || in.get<uint64_t>() != cycle_) {
    throw HoraInternalError("Rank 0 received an engine message out of step from rank " + std::to_string(from) + ".");
  }
  const Clock::time_point now = Clock::now();
  for (int slot : from_bits(in.get_vector<uint64_t>())) {
    const int set = cache_.at(slot).process_set;
    coordinator_->add(from, cache_.request_for(slot, sets_.member_index(set, from)), now);
  }
  const uint32_t count = in.get<uint32_t>();
  for (uint32_t i = 0; i < count; ++i) coordinator_->add(from, read_request(in), now);
}

std::vector<char> Engine::encode_responses(const std::vector<Response>& responses, const std::string& stall,
                                           const std::string& abort_reason) {
  Writer out;
  out.put<MessageType>(MessageType::kResponses);
  out.put<uint64_t>(cycle_);
  out.put_string(stall);
  out.put_string(abort_reason);
  out.put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const Response& response : responses) {
    write_parameters(out, response);
    out.put<uint32_t>(static_cast<uint32_t>(response.tensors.size()));
    for (const TensorEntry& tensor : response.tensors) {
      const int slot = cache_.find(response, tensor);
      out.put<int32_t>(slot);
      if (slot < 0) write_tensor(out, tensor);
    }
  }
  return std::move(out.data());
}

std::vector<Response> Engine::decode_responses(const std::vector<char>& message, std::string* stall,
                                               std::string* abort_reason) {
  Reader in(message.data(), message.size());
  if (in.get<MessageType>() != MessageType::kResponses || in.get<uint64_t>() != cycle_) {
    throw HoraInternalError("Rank " + std::to_string(rank_) + " received a response list out of step from rank 0.");
  }
  *stall = in.get_string();
  *abort_reason = in.get_string();
  std::vector<Response> responses(in.get<uint32_t>());
  for (Response& response : responses) {
    response = read_parameters(in);
    const uint32_t count = in.get<uint32_t>();
    for (uint32_t i = 0; i < count; ++i) {
      const int32_t slot = in.get<int32_t>();
      response.tensors.push_back(slot >= 0 ? cache_.at(slot).tensors.front() : read_tensor(in));
    }
  }
  return responses;
}

void Engine::apply(const std::vector<Response>& responses) {
  for (const Response& response : responses) {
    cache_.update(response);
    auto local = [&](const std::string& name) -> Submission* {
      const auto found = pending_.find(std::to_string(response.process_set) + ":" + name);
      return found == pending_.end() ? nullptr : &found->second;
    };
    auto finish = [&](Submission* submission, Result result) {
      if (submission == nullptr) return;
      const int64_t handle = submission->handle;
      pending_.erase(key_of(submission->request));
      std::vector<std::pair<int64_t, Result>> completed;
      completed.emplace_back(handle, std::move(result));
      complete(std::move(completed));
    };
    if (!response.error.empty()) {
      for (const TensorEntry& tensor : response.tensors) {
        if (Submission* submission = local(tensor.name)) {
          const int64_t handle = submission->handle;
          pending_.erase(key_of(submission->request));
          fail(handle, std::make_exception_ptr(std::invalid_argument(response.error)));
        }
      }
      continue;
    }
    switch (response.kind) {
      case RequestKind::kJoin: {
        Result result;
        result.value = response.last_joined;
        finish(local("join"), result);
        continue;
      }
      case RequestKind::kShutdown: {
        std::string who;
        for (int rank : response.ranks) who += (who.empty() ? "" : ", ") + std::to_string(rank);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          shutdown_reason_ = "Hora shut down (rank " + who + " called hora.shutdown() or exited)";
        }
        finish(local("shutdown"), Result{});
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
        finish(local(response.tensors.front().name), result);
        continue;
      }
      case RequestKind::kRemoveProcessSet: {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          sets_.remove(response.ranks.empty() ? -1 : response.ranks.front());
        }
        finish(local(response.tensors.front().name), Result{});
        continue;
      }
      default: break;
    }
    const std::vector<int>* members = sets_.find(response.process_set);
    if (members == nullptr || sets_.member_index(response.process_set, rank_) < 0) continue;
    std::vector<const Submission*> mine;
    const Clock::time_point now = Clock::now();
    for (const TensorEntry& tensor : response.tensors) {
      const Submission* submission = local(tensor.name);
      mine.push_back(submission);
      if (submission != nullptr && moves_data(response.kind)) timeline_.end(tensor.name, now);
    }
    std::vector<Result> results = executor_.execute(response, mine, *members);
    // Complete the whole response under one lock, waking the waiting threads once.
    std::vector<std::pair<int64_t, Result>> completed;
    for (std::size_t i = 0; i < response.tensors.size(); ++i) {
      if (mine[i] == nullptr) continue;
      completed.emplace_back(mine[i]->handle, std::move(results[i]));
      pending_.erase(key_of(mine[i]->request));
    }
    complete(std::move(completed));
  }
}

void Engine::complete(std::vector<std::pair<int64_t, Result>> completed) {
  if (completed.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [handle, result] : completed) {
    HandleState& state = handles_.at(handle);
    state.done = true;
    state.result = std::move(result);
    in_flight_.erase(state.key);
  }
  done_cv_.notify_all();
}

void Engine::fail(int64_t handle, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  HandleState& state = handles_.at(handle);
  state.done = true;
  state.error = std::move(error);
  in_flight_.erase(state.key);
  done_cv_.notify_all();
}

void Engine::fail_everything(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = error;
  for (auto& [id, state] : handles_) {
    if (!state.done) {
      state.done = true;
      state.error = failure_;
    }
  }
  in_flight_.clear();
  queue_.clear();
  pending_.clear();
  done_cv_.notify_all();
}

}  // namespace hora
