// A peer's operations over its TCP connection, moved without blocking.
#pragma once

#include <cstddef>
#include <vector>

#include "link_queues.h"

namespace hora {

class TcpLink {
 public:
  // Moves bytes of the front operations of `queues` over the non-blocking
  // socket `fd` until it would block; returns whether anything moved. Throws
  // LinkLost when the connection fails or the peer closes it.
  bool progress(int fd, LinkQueues& queues);

 private:
  std::size_t receive_reducing(int fd, Operation& op);

  std::vector<char> staging_;  // a reducing receive lands here first
  std::size_t staged_ = 0;     // bytes of a partial element kept at the front of staging_
};

}  // namespace hora
