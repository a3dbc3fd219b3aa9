// The table of process sets: id -> member ranks. Set 0 is every rank. Every
// rank changes its copy only while applying a response, in the agreed
// order, so all copies stay identical without further messages.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace hora {

class ProcessSets {
 public:
  explicit ProcessSets(int world_size);

  // The members of set `id`, or nullptr when there is no such set.
  const std::vector<int>* find(int id) const;
  int add(const std::vector<int>& members);  // returns the new id
  void remove(int id);
  // Whether a set with exactly these members exists; returns its id or -1.
  int lookup(const std::vector<int>& members) const;
  // The set rank of global rank `rank` in set `id`, or -1.
  int member_index(int id, int rank) const;
  std::vector<int> ids() const;

 private:
  std::map<int, std::vector<int>> sets_;
  int next_id_ = 1;
};

}  // namespace hora
