#include "response_cache.h"

#include <optional>
#include <stdexcept>

namespace hora {
namespace {

constexpr RequestKind kFree = RequestKind::kShutdown;

}  // namespace

ResponseCache::ResponseCache(std::size_t capacity) : slots_(capacity), last_used_(capacity, 0) {
  for (Response& slot : slots_) slot.kind = kFree;
}


bool ResponseCache::cacheable(const Response& response) {
  return response.error.empty() && response.joined.empty() &&
         (response.kind == RequestKind::kAllreduce || response.kind == RequestKind::kAllgather ||
          response.kind == RequestKind::kBroadcast || response.kind == RequestKind::kReducescatter);
}

int ResponseCache::lookup(const Request& request, const std::string& key, int member) const {
  if (slots_.empty()) return -1;
  const auto found = index_.find(key);
  if (found == index_.end()) return -1;
  const Response& cached = slots_[found->second];
  const TensorEntry& tensor = cached.tensors.front();
  if (!answers(cached, request) || tensor.group != request.group || tensor.group_size != request.group_size) return -1;
  if (cached.kind == RequestKind::kAllgather) {
    if (request.shape.empty() || static_cast<std::size_t>(member) >= tensor.first_dims.size() ||
        request.shape[0] != tensor.first_dims[member] ||
        std::vector<int64_t>(request.shape.begin() + 1, request.shape.end()) !=
            std::vector<int64_t>(tensor.shape.begin() + 1, tensor.shape.end())) {
      return -1;
    }
  } else if (request.shape != tensor.shape) {
    return -1;
  }
  return found->second;
}

Request ResponseCache::request_for(int slot, int member) const {
  const Response& cached = at(slot);
  Request request = hora::request_for(cached, cached.tensors.front());
  if (cached.kind == RequestKind::kAllgather) request.shape[0] = cached.tensors.front().first_dims.at(member);
  return request;
}

const Response& ResponseCache::at(int slot) const {
  if (slot < 0 || static_cast<std::size_t>(slot) >= slots_.size() || slots_[slot].kind == kFree) {
    throw HoraInternalError("engine message names response cache slot " + std::to_string(slot) +
                            ", which is empty; the ranks' caches disagree.");
  }
  return slots_[slot];
}

void ResponseCache::update(const Response& response) {
  if (slots_.empty() || !cacheable(response)) return;
  std::optional<Response> parameters;  // the response without its tensors, copied once if needed
  for (const TensorEntry& tensor : response.tensors) {
    const std::string& name = assign_request_key(key_, response.process_set, tensor.name);
    auto found = index_.find(name);
    int slot;
    if (found != index_.end()) {
      slot = found->second;
      if (slots_[slot].tensors.front() == tensor && same_parameters(slots_[slot], response)) {
        last_used_[slot] = ++clock_;  // the steady state: a hit, nothing to rewrite
        continue;
      }
    } else {
      slot = 0;
      for (std::size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].kind == kFree) {
          slot = static_cast<int>(i);
          break;
        }
        if (last_used_[i] < last_used_[slot]) slot = static_cast<int>(i);
      }
      if (slots_[slot].kind != kFree) {
        index_.erase(request_key(slots_[slot].process_set, slots_[slot].tensors.front().name));
      }
      index_[name] = slot;
    }
    if (!parameters) {
      parameters = response;
      parameters->tensors.clear();
    }
    slots_[slot] = *parameters;
    slots_[slot].tensors.push_back(tensor);
    last_used_[slot] = ++clock_;
  }
}

void to_bits(const std::vector<int>& slots, std::vector<uint64_t>& bits) {
  bits.clear();
  for (int slot : slots) {
    const std::size_t word = static_cast<std::size_t>(slot) / 64;
    if (bits.size() <= word) bits.resize(word + 1, 0);
    bits[word] |= uint64_t{1} << (slot % 64);
  }
}

void from_bits(const std::vector<uint64_t>& bits, std::vector<int>& slots) {
  slots.clear();
  for (std::size_t word = 0; word < bits.size(); ++word) {
    for (uint64_t rest = bits[word]; rest != 0; rest &= rest - 1) {  // each set bit, lowest first
      slots.push_back(static_cast<int>(word * 64 + __builtin_ctzll(rest)));
    }
  }
}

}  // namespace hora
