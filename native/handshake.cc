// Connection handshake. The accepting (lower) rank speaks first, so a
// connector proves knowledge of the secret over a challenge it cannot
// predict, and then the acceptor proves the same over the connector's
// challenge; a recorded handshake is useless later because both challenges
// are fresh random bytes.
//
//   acceptor  -> connector : magic[8] challenge_a[32]
//   connector -> acceptor  : magic[8] from_rank[u32] to_rank[u32] challenge_c[32]
//                            HMAC(secret, "connect" challenge_a from_rank to_rank)
//   acceptor  -> connector : HMAC(secret, "accept" challenge_c to_rank from_rank)
//
// Integers are little-endian.
//
// A peer port is reachable by anything on the network, so the acceptor
// trusts nothing about a connection until its proof checks out, and lets no
// connection hold it up: every accepted connection gets its challenge at
// once and its own deadline, one poll() loop reads whichever has bytes, and
// at most kMaxIncoming wait at a time (a flood evicts the oldest, while a
// genuine peer answers within milliseconds of connecting). A connection that
// stalls, closes or fails a check is logged and closed; the acceptor keeps
// waiting for the genuine peer until the connect deadline.
#include "handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>

#include "errors.h"
#include "hmac.h"
#include "warnings.h"

namespace hora {
namespace {

constexpr char kMagic[8] = {'H', 'O', 'R', 'A', 'T', 'C', 'P', '1'};
constexpr std::size_t kChallengeBytes = 32;
constexpr std::size_t kRequestBytes = sizeof kMagic + 8 + kChallengeBytes + sizeof(Digest);
constexpr std::size_t kMaxIncoming = 64;
// Connections taken from the backlog per pass of the loop, so that a flood
// cannot keep the loop from reading the connections it already holds.
constexpr int kAcceptsPerPass = 16;

std::string hex(const uint8_t* bytes, std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    text += "0123456789abcdef"[bytes[i] >> 4];
    text += "0123456789abcdef"[bytes[i] & 15];
  }
  return text;
}

using Challenge = std::array<uint8_t, kChallengeBytes>;

void put_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint32_t get_u32(const uint8_t* in) {
  return uint32_t{in[0]} | (uint32_t{in[1]} << 8) | (uint32_t{in[2]} << 16) | (uint32_t{in[3]} << 24);
}

Digest proof(const std::string& secret, const char* label, const Challenge& challenge, uint32_t a, uint32_t b) {
  std::vector<uint8_t> message(label, label + std::strlen(label));
  message.insert(message.end(), challenge.begin(), challenge.end());
  put_u32(message, a);
  put_u32(message, b);
  return hmac_sha256(secret, message.data(), message.size());
}

// One accepted connection whose handshake is under way.
struct Incoming {
  int fd = -1;
  std::string from;
  Challenge challenge{};
  std::array<uint8_t, kRequestBytes> request{};
  std::size_t received = 0;
  Clock::time_point deadline;
};

void reject(int rank, Incoming& connection, const std::string& why) {
  warn("hora: rank " + std::to_string(rank) + " rejected a connection from " + connection.from + ": " + why);
  close_fd(connection.fd);
  connection.fd = -1;
}

// A connector that has proven itself: its rank, and the challenge it set
// for this side's proof.
struct Proven {
  uint32_t rank;
  Challenge challenge;
};

// Checks a complete request; throws HoraInternalError saying why it is refused.
Proven verify(const Incoming& connection, const std::string& secret, uint32_t my_rank, uint32_t size) {
  const uint8_t* request = connection.request.data();
  if (std::memcmp(request, kMagic, sizeof kMagic) != 0) {
    throw HoraInternalError("bad handshake magic " + hex(request, sizeof kMagic) + " (expected " +
                            hex(reinterpret_cast<const uint8_t*>(kMagic), sizeof kMagic) + ")");
  }
  Proven proven{get_u32(request + sizeof kMagic), {}};
  const uint32_t to_rank = get_u32(request + sizeof kMagic + 4);
  std::memcpy(proven.challenge.data(), request + sizeof kMagic + 8, kChallengeBytes);
  Digest theirs;
  std::memcpy(theirs.data(), request + sizeof kMagic + 8 + kChallengeBytes, theirs.size());
  if (!digests_equal(theirs, proof(secret, "connect", connection.challenge, proven.rank, to_rank))) {
    throw HoraInternalError("authentication failed: the peer does not hold this job's secret");
  }
  if (to_rank != my_rank || proven.rank <= my_rank || proven.rank >= size) {
    throw HoraInternalError("peer claims rank " + std::to_string(proven.rank) + " connecting to rank " +
                            std::to_string(to_rank) + ", which does not fit this rank (" + std::to_string(my_rank) +
                            " of " + std::to_string(size) + ")");
  }
  return proven;
}

}  // namespace

void handshake_as_connector(int fd, const std::string& secret, uint32_t from_rank, uint32_t to_rank,
                            const std::string& peer, Clock::time_point deadline) {
  uint8_t hello[sizeof kMagic + kChallengeBytes];
  read_fully(fd, hello, sizeof hello, deadline, "the handshake challenge from " + peer);
  if (std::memcmp(hello, kMagic, sizeof kMagic) != 0) {
    throw HandshakeRefused("The process at " + peer + " is not a Hora worker (bad handshake magic " +
                           hex(hello, sizeof kMagic) + ").");
  }
  Challenge challenge_a;
  std::memcpy(challenge_a.data(), hello + sizeof kMagic, kChallengeBytes);
  const Challenge challenge_c = random_array<kChallengeBytes>();

  std::vector<uint8_t> reply(kMagic, kMagic + sizeof kMagic);
  put_u32(reply, from_rank);
  put_u32(reply, to_rank);
  reply.insert(reply.end(), challenge_c.begin(), challenge_c.end());
  const Digest mine = proof(secret, "connect", challenge_a, from_rank, to_rank);
  reply.insert(reply.end(), mine.begin(), mine.end());
  write_fully(fd, reply.data(), reply.size(), deadline, "the handshake to " + peer);

  Digest theirs;
  read_fully(fd, theirs.data(), theirs.size(), deadline, "the handshake proof from " + peer);
  if (!digests_equal(theirs, proof(secret, "accept", challenge_c, to_rank, from_rank))) {
    throw HandshakeRefused("The peer at " + peer + " failed authentication: it does not hold this job's secret.");
  }
}

std::vector<int> accept_peers(int listen_fd, const std::string& secret, int rank, int size,
                              Clock::time_point deadline) {
  std::vector<int> peers(size, -1);
  int missing = size - 1 - rank;
  std::deque<Incoming> incoming;
  auto close_all = [&] {
    for (Incoming& connection : incoming) close_fd(connection.fd);
    for (int fd : peers) close_fd(fd);
  };
  try {
    while (missing > 0) {
      const Clock::time_point now = Clock::now();
      for (Incoming& connection : incoming) {
        if (now >= connection.deadline) reject(rank, connection, "no complete handshake within the time allowed");
      }
      incoming.erase(std::remove_if(incoming.begin(), incoming.end(), [](const Incoming& c) { return c.fd < 0; }),
                     incoming.end());
      if (now >= deadline) break;

      std::vector<pollfd> polls{{listen_fd, POLLIN, 0}};
      Clock::time_point wake = deadline;
      for (const Incoming& connection : incoming) {
        polls.push_back({connection.fd, POLLIN, 0});
        wake = std::min(wake, connection.deadline);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
      if (::poll(polls.data(), polls.size(), static_cast<int>(std::min<long long>(wait, 1000))) < 0 && errno != EINTR) {
        throw HoraInternalError("poll() failed while accepting connections: " + errno_text(errno));
      }

      // Sockets with bytes first (polls[i + 1] is incoming[i]); new connections join after.
      for (std::size_t i = 0; i < incoming.size(); ++i) {
        Incoming& connection = incoming[i];
        if (polls[i + 1].revents == 0) continue;
        const ssize_t n = ::recv(connection.fd, connection.request.data() + connection.received,
                                 kRequestBytes - connection.received, MSG_DONTWAIT);
        if (n == 0) {
          reject(rank, connection, "it closed the connection during the handshake");
          continue;
        }
        if (n < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) reject(rank, connection, errno_text(errno));
          continue;
        }
        connection.received += static_cast<std::size_t>(n);
        if (connection.received < kRequestBytes) continue;
        try {
          const Proven peer = verify(connection, secret, rank, size);
          if (peers[peer.rank] >= 0) throw HoraInternalError("rank " + std::to_string(peer.rank) + " connected twice");
          const Digest mine = proof(secret, "accept", peer.challenge, rank, peer.rank);
          write_fully(connection.fd, mine.data(), mine.size(), connection.deadline, "the handshake proof");
          peers[peer.rank] = connection.fd;
          connection.fd = -1;
          --missing;
        } catch (const HoraInternalError& error) {
          reject(rank, connection, error.what());
        }
      }
      incoming.erase(std::remove_if(incoming.begin(), incoming.end(), [](const Incoming& c) { return c.fd < 0; }),
                     incoming.end());
      if (polls[0].revents != 0) {
        std::string from;
        int fd = -1;
        for (int accepted = 0; accepted < kAcceptsPerPass && (fd = accept_pending(listen_fd, &from)) >= 0; ++accepted) {
          if (incoming.size() >= kMaxIncoming) {
            // The oldest that has sent nothing goes first: a genuine peer answers its challenge at once.
            const auto silent = [](const Incoming& c) { return c.received == 0; };
            auto victim = std::find_if(incoming.begin(), incoming.end(), silent);
            if (victim == incoming.end()) victim = incoming.begin();
            reject(rank, *victim, "evicted: more than " + std::to_string(kMaxIncoming) +
                                      " connections were waiting to authenticate");
            incoming.erase(victim);
          }
          Incoming connection;
          connection.fd = fd;
          connection.from = from;
          connection.challenge = random_array<kChallengeBytes>();
          connection.deadline = std::min(deadline, Clock::now() + kHandshakeTimeout);
          std::vector<uint8_t> hello(kMagic, kMagic + sizeof kMagic);
          hello.insert(hello.end(), connection.challenge.begin(), connection.challenge.end());
          try {
            write_fully(fd, hello.data(), hello.size(), connection.deadline, "the handshake challenge");
          } catch (const HoraInternalError& error) {
            reject(rank, connection, error.what());
            continue;
          }
          incoming.push_back(std::move(connection));
        }
      }
    }
  } catch (...) {  // accept() out of descriptors, poll() failing: nothing accepted may leak
    close_all();
    throw;
  }
  for (Incoming& connection : incoming) {
    reject(rank, connection, missing > 0 ? "the connect deadline passed" : "every peer has connected");
  }
  return peers;
}

}  // namespace hora
