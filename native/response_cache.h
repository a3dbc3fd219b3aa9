// The response cache. Training submits the same tensors every step, so after
// the first step every rank already knows the response its request will get.
// Each cached response has a slot number that is the same on every rank; a
// rank then announces a request as one bit of a bit vector instead of its
// full description, so a steady-state cycle is one exchange of bit vectors.
//
// Every rank updates its cache from the responses of each cycle, in the
// agreed order, with the same least-recently-used eviction, so the caches
// (and the slot numbers) stay identical without any extra message.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "request.h"

namespace hora {

class ResponseCache {
 public:
  explicit ResponseCache(std::size_t capacity);

  std::size_t capacity() const { return slots_.size(); }

  // The slot whose response answers `request` (whose key, "<set>:<name>",
  // is `key`) from the member with set rank `member`, or -1.
  int lookup(const Request& request, const std::string& key, int member) const;

  // The request that the member with set rank `member` announced by `slot`.
  Request request_for(int slot, int member) const;

  // The cached single-tensor response in `slot`.
  const Response& at(int slot) const;

  // Records the tensors of an executed response.
  void update(const Response& response);

 private:
  static bool cacheable(const Response& response);

  std::vector<Response> slots_;  // each holds one tensor; kind kShutdown marks a free slot
  std::vector<uint64_t> last_used_;
  std::unordered_map<std::string, int> index_;
  uint64_t clock_ = 0;
  std::string key_;  // update()'s lookups, in one buffer
};

// Bit vectors of slot numbers, as exchanged in cycle messages; each fills
// its second argument, reusing its memory.
void to_bits(const std::vector<int>& slots, std::vector<uint64_t>& bits);
void from_bits(const std::vector<uint64_t>& bits, std::vector<int>& slots);

}  // namespace hora
