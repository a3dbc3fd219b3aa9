#include "shm_segment.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "errors.h"
#include "hmac.h"
#include "warnings.h"

namespace hora {
namespace {

constexpr std::size_t kControlBytes = 4096;  // both control blocks and both probes, one page
constexpr std::size_t kProbesAt = 2048;
constexpr std::size_t kSegmentBytes = kControlBytes + 2 * kRingBytes;
static_assert(2 * sizeof(RingControl) <= kProbesAt, "control blocks must fit before the probes");
static_assert(kProbesAt + 2 * sizeof(ShmSegment::Probe) <= kControlBytes, "probes must fit the control page");

pid_t peer_process(int unix_fd) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(unix_fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return 0;
  return credentials.pid;  // as this process's pid namespace sees it; 0 where it cannot
}

constexpr std::size_t kTokenBytes = 32;
constexpr std::size_t kNameBytes = 24;  // after the abstract namespace's leading NUL
using Token = std::array<uint8_t, kTokenBytes>;

sockaddr_un abstract_address(const char (&name)[kNameBytes]) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name, kNameBytes);
  return address;
}

constexpr socklen_t kAddressBytes = offsetof(sockaddr_un, sun_path) + 1 + kNameBytes;

// One status byte over TCP: whether this side goes on with shared memory.
void say(int fd, bool yes, Clock::time_point deadline) {
  const uint8_t byte = yes ? 1 : 0;
  write_fully(fd, &byte, 1, deadline, "the shared-memory set-up");
}

bool hear(int fd, Clock::time_point deadline) {
  uint8_t byte = 0;
  read_fully(fd, &byte, 1, deadline, "the shared-memory set-up");
  return byte == 1;
}

// One byte of payload with room for one descriptor beside it (SCM_RIGHTS).
struct DescriptorMessage {
  char payload = 'S';
  iovec io{&payload, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};

  DescriptorMessage() {
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
  }
  DescriptorMessage(const DescriptorMessage&) = delete;
  DescriptorMessage& operator=(const DescriptorMessage&) = delete;
};

void send_descriptor(int socket_fd, int fd) {
  DescriptorMessage carrier;
  msghdr& message = carrier.message;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  if (::sendmsg(socket_fd, &message, MSG_NOSIGNAL) != 1) {
    throw HoraInternalError("sending the shared-memory segment failed: " + errno_text(errno));
  }
}

int receive_descriptor(int socket_fd, Clock::time_point deadline) {
  DescriptorMessage carrier;
  msghdr& message = carrier.message;
  pollfd entry{socket_fd, POLLIN, 0};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (::poll(&entry, 1, static_cast<int>(std::max<long long>(left, 0))) != 1) {
    throw HoraInternalError("timed out waiting for the shared-memory segment");
  }
  if (::recvmsg(socket_fd, &message, MSG_CMSG_CLOEXEC) != 1) {
    throw HoraInternalError("receiving the shared-memory segment failed: " + errno_text(errno));
  }
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (header == nullptr || header->cmsg_type != SCM_RIGHTS) {
    throw HoraInternalError("the peer sent no shared-memory segment");
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(header), sizeof(int));
  return fd;
}

// A listening abstract Unix socket with a random name, closed on scope exit.
struct UnixListener {
  int fd = -1;
  char name[kNameBytes] = {};

  UnixListener() {
    const Token random = random_array<kTokenBytes>();
    std::snprintf(name, sizeof name, "hora-");
    for (std::size_t i = 5; i < kNameBytes; ++i) name[i] = "0123456789abcdef"[random[i] & 15];
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw HoraInternalError("socket(AF_UNIX) failed: " + errno_text(errno));
    const sockaddr_un address = abstract_address(name);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), kAddressBytes) != 0 || ::listen(fd, 4) != 0) {
      const int error = errno;
      close_fd(fd);
      throw HoraInternalError("binding an abstract Unix socket failed: " + errno_text(error));
    }
    set_nonblocking(fd);
  }
  ~UnixListener() { close_fd(fd); }
};

}  // namespace

ShmSegment::ShmSegment(int fd, void* base) : fd_(fd), base_(base) {
  const auto random = random_array<sizeof(uint64_t)>();
  std::memcpy(&probe_value_, random.data(), sizeof probe_value_);
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, kSegmentBytes);
  close_fd(fd_);
}

std::unique_ptr<ShmSegment> ShmSegment::create() {
  const int fd = ::memfd_create("hora-shm", MFD_CLOEXEC);
  if (fd < 0) throw HoraInternalError("memfd_create() failed: " + errno_text(errno));
  if (::ftruncate(fd, static_cast<off_t>(kSegmentBytes)) != 0) {
    const int error = errno;
    close_fd(fd);
    throw HoraInternalError("sizing the shared-memory segment failed: " + errno_text(error));
  }
  std::unique_ptr<ShmSegment> segment = map(fd);
  for (int direction = 0; direction < 2; ++direction) new (segment->control(direction)) RingControl();
  for (bool side : {true, false}) new (segment->probe(side)) Probe();
  return segment;
}

std::unique_ptr<ShmSegment> ShmSegment::map(int fd) {
  void* base = ::mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    close_fd(fd);
    throw HoraInternalError("mapping the shared-memory segment failed: " + errno_text(error));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(fd, base));
}

RingControl* ShmSegment::control(int direction) const {
  return reinterpret_cast<RingControl*>(static_cast<char*>(base_) + direction * sizeof(RingControl));
}

ShmSegment::Probe* ShmSegment::probe(bool creator) const {
  return reinterpret_cast<Probe*>(static_cast<char*>(base_) + kProbesAt + (creator ? 0 : sizeof(Probe)));
}

char* ShmSegment::data(int direction) const {
  return static_cast<char*>(base_) + kControlBytes + direction * kRingBytes;
}

ByteRing ShmSegment::outgoing(bool creator) {
  const int direction = creator ? 0 : 1;
  return ByteRing(control(direction), data(direction));
}

ByteRing ShmSegment::incoming(bool creator) {
  const int direction = creator ? 1 : 0;
  return ByteRing(control(direction), data(direction));
}

// Lower rank:  offer[1] (then, if 1: name[24] token[32]) ... answer[1]
// Higher rank: connects to the name, sends the token, receives the segment
//              and answers 1 once mapped, or answers 0 at the first failure.
std::unique_ptr<ShmSegment> offer_segment(int tcp_fd, bool wanted, Clock::time_point deadline) {
  std::unique_ptr<ShmSegment> segment;
  std::unique_ptr<UnixListener> listener;
  if (wanted) {
    try {
      segment = ShmSegment::create();
      listener = std::make_unique<UnixListener>();
    } catch (const HoraInternalError& error) {
      warn(std::string("hora: shared memory unavailable, using TCP: ") + error.what());
      segment.reset();
    }
  }
  say(tcp_fd, segment != nullptr, deadline);
  if (segment == nullptr) return nullptr;
  const Token token = random_array<kTokenBytes>();
  write_fully(tcp_fd, listener->name, kNameBytes, deadline, "the shared-memory set-up");
  write_fully(tcp_fd, token.data(), token.size(), deadline, "the shared-memory set-up");

  // Serve connections until the genuine peer has the segment, or until it
  // answers on TCP (it could not connect, or refused).
  while (true) {
    pollfd entries[2] = {{listener->fd, POLLIN, 0}, {tcp_fd, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw HoraInternalError("Timed out setting up shared memory with a peer on this host.");
    const int ready = ::poll(entries, 2, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) throw HoraInternalError("poll() failed: " + errno_text(errno));
    if (entries[1].revents) return hear(tcp_fd, deadline) ? std::move(segment) : nullptr;
    if (!entries[0].revents) continue;
    const int connection = ::accept4(listener->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) continue;
    try {
      Token theirs;
      read_fully(connection, theirs.data(), theirs.size(), std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                 "the shared-memory token");
      if (theirs != token) throw HoraInternalError("wrong token");
      send_descriptor(connection, segment->fd());
      segment->set_peer_pid(peer_process(connection));
      close_fd(connection);
    } catch (const HoraInternalError& error) {
      warn(std::string("hora: rejected a shared-memory connection: ") + error.what());
      close_fd(connection);
      continue;
    }
    return hear(tcp_fd, deadline) ? std::move(segment) : nullptr;
  }
}

std::unique_ptr<ShmSegment> accept_segment(int tcp_fd, bool wanted, Clock::time_point deadline) {
  if (!hear(tcp_fd, deadline)) return nullptr;
  char name[kNameBytes];
  Token token;
  read_fully(tcp_fd, name, kNameBytes, deadline, "the shared-memory set-up");
  read_fully(tcp_fd, token.data(), token.size(), deadline, "the shared-memory set-up");
  if (!wanted) {
    say(tcp_fd, false, deadline);
    return nullptr;
  }
  std::unique_ptr<ShmSegment> segment;
  const int connection = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  try {
    if (connection < 0) throw HoraInternalError("socket(AF_UNIX) failed: " + errno_text(errno));
    const sockaddr_un address = abstract_address(name);
    // A peer in another network namespace has the same host name but no
    // shared abstract sockets: that pair falls back to TCP.
    if (::connect(connection, reinterpret_cast<const sockaddr*>(&address), kAddressBytes) != 0) {
      throw HoraInternalError("connecting to the peer's set-up socket failed: " + errno_text(errno));
    }
    set_nonblocking(connection);
    write_fully(connection, token.data(), token.size(), deadline, "the shared-memory token");
    segment = ShmSegment::map(receive_descriptor(connection, deadline));
    segment->set_peer_pid(peer_process(connection));
  } catch (const HoraInternalError& error) {
    warn(std::string("hora: shared memory with a peer on this host failed, using TCP: ") + error.what());
    segment.reset();
  }
  close_fd(connection);
  say(tcp_fd, segment != nullptr, deadline);
  return segment;
}

// Both: probe[address value] in the segment, then wanted[1], then worked[1],
// then, if both worked, buffer_bytes[8].
bool agree_single_copy(int tcp_fd, ShmSegment& segment, bool creator, bool wanted, bool only_peer,
                       std::size_t buffer_bytes, Clock::time_point deadline) {
  // Under Yama's ptrace_scope=1 only an ancestor, or the one process a
  // process names, may read its memory; ranks are siblings. Naming the peer
  // is exact when it is the only one; with several, this process would have
  // to let any process of its user in (PR_SET_PTRACER_ANY), which we do not.
  // Without Yama the call fails (EINVAL) and nothing needs it.
  // Set afresh at every set-up, so that a later round's peers never find an
  // earlier round's peer (whose pid another process may take) named here.
  if (wanted) {
    const bool name_peer = only_peer && segment.peer_pid() > 0;
    ::prctl(PR_SET_PTRACER, name_peer ? static_cast<unsigned long>(segment.peer_pid()) : 0UL, 0, 0, 0);
  }
  ShmSegment::Probe* mine = segment.probe(creator);
  mine->address.store(reinterpret_cast<uint64_t>(&segment.probe_value()), std::memory_order_relaxed);
  mine->value.store(segment.probe_value(), std::memory_order_seq_cst);
  say(tcp_fd, wanted, deadline);
  const bool both_want = hear(tcp_fd, deadline) && wanted;
  bool worked = false;
  if (both_want && segment.peer_pid() > 0) {
    const ShmSegment::Probe* theirs = segment.probe(!creator);
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(theirs->address.load(std::memory_order_seq_cst)), sizeof value};
    if (::process_vm_readv(segment.peer_pid(), &local, 1, &remote, 1, 0) == sizeof value) {
      worked = value == theirs->value.load(std::memory_order_relaxed);
    } else {
      const int error = errno;
      warn("hora: shared memory without single copy (every byte copied twice): the kernel does not let this rank "
           "read its peer's memory (process_vm_readv: " + errno_text(error) + ")" +
           (error == EPERM ? "; under Yama's kernel.yama.ptrace_scope=1 it may only with one peer per host" : "") +
           ". HORA_SHM_SINGLE_COPY=0 silences this.");
    }
  } else if (both_want) {
    warn("hora: shared memory without single copy (every byte copied twice): the kernel did not say which "
         "process the peer is.");
  }
  say(tcp_fd, worked, deadline);
  if (!(hear(tcp_fd, deadline) && worked)) return false;
  const uint64_t own_bytes = buffer_bytes;
  uint64_t peer_bytes = 0;
  write_fully(tcp_fd, &own_bytes, sizeof own_bytes, deadline, "the shared-memory set-up");
  read_fully(tcp_fd, &peer_bytes, sizeof peer_bytes, deadline, "the shared-memory set-up");
  if (peer_bytes != own_bytes) {
    throw HoraInternalError("this rank passes messages by reference from buffers of " + std::to_string(own_bytes) +
                            " bytes and the peer from " + std::to_string(peer_bytes) +
                            "; every rank must give the same single_copy_buffer_bytes.");
  }
  return true;
}

}  // namespace hora
