// The authenticated handshake that opens every TCP link of a job's mesh
// (see handshake.cc for the protocol).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"
#include "tcp_socket.h"

namespace hora {

// How long one handshake may take, on either side.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

// Thrown by the connector when the acceptor answered but is not a genuine
// peer (not a Hora worker, or without this job's secret): no point retrying.
class HandshakeRefused : public HoraInternalError {
 public:
  explicit HandshakeRefused(const std::string& what) : HoraInternalError(what) {}
};

// Connector side, on a freshly connected socket to `to_rank`; throws
// HandshakeRefused if the acceptor does not prove it holds `secret`, and
// HoraInternalError if the connection fails first.
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
