// Small POSIX socket helpers for the TCP transport. Every blocking helper
// takes a deadline and throws HoraInternalError when it passes.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "errors.h"

namespace hora {

using Clock = std::chrono::steady_clock;

struct PeerAddress {
  std::string host;
  int port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

// A listening socket, bound before rendezvous so that its port can be
// published to the peers.
class TcpListener {
 public:
  TcpListener(const std::string& bind_host, int port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  void close();

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
};

void set_nonblocking(int fd);
void set_nodelay(int fd);
void close_fd(int fd);

// Connects to `address`, retrying refused connections until `deadline`.
int connect_to(const PeerAddress& address, Clock::time_point deadline);

// Accepts one connection; returns -1 if the deadline passes first.
int accept_before(int listen_fd, Clock::time_point deadline, std::string* peer_description);
// Accepts a connection that is already waiting on the non-blocking
// `listen_fd`; returns -1 at once if there is none.
int accept_pending(int listen_fd, std::string* peer_description);

// Move exactly `bytes` bytes over a non-blocking socket, or throw.
void write_fully(int fd, const void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what);
void read_fully(int fd, void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what);

std::string errno_text(int error);


}  // namespace hora
