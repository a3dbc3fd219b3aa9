#include "tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "errors.h"

namespace hora {
namespace {

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000 ? 1000 : static_cast<int>(left);
}

// Waits for `events` on fd; returns false when the deadline passed.
bool poll_until(int fd, short events, Clock::time_point deadline) {
  while (true) {
    if (Clock::now() >= deadline) return false;
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, millis_until(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) throw HoraInternalError("poll() failed: " + errno_text(errno));
  }
}

}  // namespace

std::string errno_text(int error) { return std::string(std::strerror(error)) + " (errno " + std::to_string(error) + ")"; }

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw HoraInternalError("Could not make a socket non-blocking: " + errno_text(errno));
  }
}

void set_nodelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) {
    throw HoraInternalError("Could not set TCP_NODELAY: " + errno_text(errno));
  }
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

TcpListener::TcpListener(const std::string& bind_host, int port) : host_(bind_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), service.c_str(), &hints, &results);
  if (rc != 0) {
    throw std::invalid_argument("Cannot resolve the bind address '" + bind_host + "': " + gai_strerror(rc) + ".");
  }
  std::string last_error = "no addresses";
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      fd_ = fd;
      break;
    }
    last_error = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(results);
  if (fd_ < 0) {
    throw HoraInternalError("Could not listen on " + bind_host + ":" + service + ": " + last_error + ".");
  }
  set_nonblocking(fd_);
}

TcpListener::~TcpListener() { close(); }

void TcpListener::close() {
  close_fd(fd_);
  fd_ = -1;
}

int connect_to(const PeerAddress& address, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error;
  while (true) {
    addrinfo* results = nullptr;
    const int rc = ::getaddrinfo(address.host.c_str(), std::to_string(address.port).c_str(), &hints, &results);
    if (rc != 0) {
      last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
          last_error = errno_text(errno);
          continue;
        }
        int error = 0;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
          error = errno;
          if (error == EINPROGRESS) {
            if (!poll_until(fd, POLLOUT, deadline)) {
              error = ETIMEDOUT;
            } else {
              socklen_t length = sizeof error;
              ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
            }
          }
        }
        if (error == 0) {
          ::freeaddrinfo(results);
          set_nodelay(fd);
          return fd;
        }
        last_error = errno_text(error);
        ::close(fd);
      }
      ::freeaddrinfo(results);
    }
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw HoraInternalError("Could not connect to " + address.to_string() + " before the timeout: " + last_error + ".");
}

int accept_pending(int listen_fd, std::string* peer_description) {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t length = sizeof peer;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
      throw HoraInternalError("accept() failed: " + errno_text(errno));
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (peer.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<sockaddr_in*>(&peer);
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      port = ntohs(in->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<sockaddr_in6*>(&peer);
      ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      port = ntohs(in6->sin6_port);
    }
    *peer_description = std::string(host) + ":" + std::to_string(port);
    set_nodelay(fd);
    return fd;
  }
}

int accept_before(int listen_fd, Clock::time_point deadline, std::string* peer_description) {
  while (poll_until(listen_fd, POLLIN, deadline)) {
    const int fd = accept_pending(listen_fd, peer_description);
    if (fd >= 0) return fd;
  }
  return -1;
}

void write_fully(int fd, const void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, cursor, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      cursor += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!poll_until(fd, POLLOUT, deadline)) throw HoraInternalError("Timed out sending " + what + ".");
      continue;
    }
    throw HoraInternalError("Failed sending " + what + ": " + errno_text(errno) + ".");
  }
}

void read_fully(int fd, void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, cursor, bytes, MSG_DONTWAIT);
    if (n > 0) {
      cursor += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) throw HoraInternalError("Connection closed while receiving " + what + ".");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!poll_until(fd, POLLIN, deadline)) throw HoraInternalError("Timed out receiving " + what + ".");
      continue;
    }
    throw HoraInternalError("Failed receiving " + what + ": " + errno_text(errno) + ".");
  }
}

}  // namespace hora
