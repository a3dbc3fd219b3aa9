#include "process_sets.h"

#include <algorithm>
#include <numeric>

namespace hora {

ProcessSets::ProcessSets(int world_size) {
  std::vector<int> everyone(world_size);
  std::iota(everyone.begin(), everyone.end(), 0);
  sets_[0] = everyone;
}

const std::vector<int>* ProcessSets::find(int id) const {
  const auto found = sets_.find(id);
  return found == sets_.end() ? nullptr : &found->second;
}

int ProcessSets::add(const std::vector<int>& members) {
  const int id = next_id_++;
  sets_[id] = members;
  return id;
}

void ProcessSets::remove(int id) {
  if (id != 0) sets_.erase(id);
}

int ProcessSets::lookup(const std::vector<int>& members) const {
  for (const auto& [id, set] : sets_) {
    if (set == members) return id;
  }
  return -1;
}

int ProcessSets::member_index(int id, int rank) const {
  const std::vector<int>* members = find(id);
  if (members == nullptr) return -1;
  const auto at = std::find(members->begin(), members->end(), rank);
  return at == members->end() ? -1 : static_cast<int>(at - members->begin());
}

std::vector<int> ProcessSets::ids() const {
  std::vector<int> ids;
  for (const auto& entry : sets_) ids.push_back(entry.first);
  return ids;
}

}  // namespace hora
