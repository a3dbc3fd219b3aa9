// The authenticated handshake that opens every TCP link of a job's mesh
// (see handshake.cc for the protocol).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tcp_socket.h"

namespace hora {

// Connector side, on a freshly connected socket to `to_rank`; throws
// HoraInternalError if the acceptor does not prove it holds `secret`.
void handshake_as_connector(int fd, const std::string& secret, uint32_t from_rank, uint32_t to_rank,
                            const std::string& peer, Clock::time_point deadline);

// Acceptor side: accepts connections on `listen_fd` until every rank above
// `rank` (of `size`) has connected and proven it holds `secret`, or until
// `deadline`, and returns their sockets (indexed by rank; -1 for this rank,
// those below it, and those that had not connected by the deadline).
// Handshakes run side by side, each with its own deadline, so a connection
// that stalls or lies is dropped (and logged) without delaying genuine peers.
std::vector<int> accept_peers(int listen_fd, const std::string& secret, int rank, int size,
                              Clock::time_point deadline);

}  // namespace hora
