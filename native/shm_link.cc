#include "shm_link.h"

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
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "hmac.h"
#include "reduce.h"
#include "warnings.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hora {
namespace {

// Bytes moved per call before the counter is published, so that the reader
// starts on a chunk while the writer copies the next.
constexpr std::size_t kChunkBytes = 64 * 1024;
// Bytes a read by reference takes per system call (and the scratch buffer's
// size): the call pins the peer's pages one by one, so fewer, larger calls.
constexpr std::size_t kReferenceChunkBytes = 256 * 1024;

// Streaming full chunks past the writer's cache.
//
// A store to a ring line that the reader's core holds must first take the
// line from that core. Usually that costs little, but on this house's 2-core
// AMD VMs it is bimodal and sticky: in a quarter to a half of the 2-rank
// launches, for the whole launch and for some message sizes, the writer's
// copies into the ring ran at 2.3-3.7 GB/s instead of 11-13 GB/s (the
// reader's side stayed fast), and allreduces took 4-9x longer (64 MiB: 45-69
// ms instead of 10-14; 1 MiB: 0.6-0.7 ms instead of 0.08-0.12). The same
// happens to a bare two-process ring outside Hora in the machine's slow
// phases. Non-temporal stores never fetch the line, and did not slow down in
// any launch, but they cost the reader a trip to memory: always streaming
// made every launch of 64 MiB take 13-18 ms (1 MiB: 0.12-0.21).
//
// So each writer times its full chunks both ways, smoothed, and streams only
// while copying through the cache costs more than twice as much as
// streaming: the slow mode, which that ratio tells apart at once (4x and
// more, against about 1x). One chunk in kProbeEvery goes the other way to
// keep both figures current, since the mode can change within a launch.
constexpr uint32_t kProbeEvery = 32;
constexpr double kStreamWhenCachedCostsTimes = 2.0;

// memcpy with non-temporal stores. Streaming stores need 16-byte aligned
// destinations: a message starts 64-byte aligned, but a reader that consumed
// part of a chunk can leave the next one anywhere, so the bytes up to the
// first 64-byte boundary are copied normally.
void copy_streaming(char* destination, const char* source, std::size_t bytes) {
  std::size_t i = std::min<std::size_t>(bytes, (64 - reinterpret_cast<std::uintptr_t>(destination) % 64) % 64);
  std::memcpy(destination, source, i);
#if defined(__SSE2__)
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i + 48), d);
  }
  _mm_sfence();  // the stores are weakly ordered: they complete before the head is published
#endif
  if (i < bytes) std::memcpy(destination + i, source + i, bytes - i);
}

constexpr std::size_t kControlBytes = 4096;  // both control blocks and both probes, one page
constexpr std::size_t kProbesAt = 2048;
constexpr std::size_t kSegmentBytes = kControlBytes + 2 * kRingBytes;
static_assert(2 * sizeof(RingControl) <= kProbesAt, "control blocks must fit before the probes");
static_assert(kProbesAt + 2 * sizeof(ShmSegment::Probe) <= kControlBytes, "probes must fit the control page");

// What the ring carries in place of a message passed by reference.
struct Reference {
  uint64_t magic;
  uint64_t address;  // of the message in the writer's memory
  uint64_t bytes;
};
constexpr uint64_t kReferenceMagic = 0x686f72612d726566;  // "hora-ref"
static_assert(sizeof(Reference) <= kMessageAlign, "a reference must fit one aligned slot");
static_assert(kRingBytes % kMessageAlign == 0, "messages must not straddle the end of the ring");

// Copies `bytes` from `address` in process `pid` into `into`: one system
// call, the kernel's copy from the peer's pages. A peer that has exited is a
// lost link; any other failure (a bad address, a forbidden call) breaks it too.
void copy_from_peer(pid_t pid, void* into, uint64_t address, std::size_t bytes) {
  iovec local{into, bytes};
  iovec remote{reinterpret_cast<void*>(address), bytes};
  const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(bytes)) return;
  if (n < 0 && errno == ESRCH) throw LinkLost(": its process is gone");
  throw LinkLost(": reading a message from its memory failed (" +
                 (n < 0 ? errno_text(errno) : std::to_string(n) + " of " + std::to_string(bytes) + " bytes") + ")");
}

pid_t peer_process(int unix_fd) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(unix_fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return 0;
  return credentials.pid;  // as this process's pid namespace sees it; 0 where it cannot
}

constexpr std::size_t kTokenBytes = 32;
constexpr std::size_t kNameBytes = 24;  // after the abstract namespace's leading NUL
using Token = std::array<uint8_t, kTokenBytes>;

uint64_t align_up(uint64_t position) { return (position + kMessageAlign - 1) / kMessageAlign * kMessageAlign; }

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

std::size_t ByteRing::write(const char* source, std::size_t bytes, bool* wake_peer) {
  const uint64_t tail = control_->tail.load(std::memory_order_acquire);
  if (position_ >= tail + kRingBytes) return 0;
  const std::size_t offset = position_ % kRingBytes;
  const std::size_t n = std::min({bytes, static_cast<std::size_t>(tail + kRingBytes - position_),
                                  kRingBytes - offset, kChunkBytes});
  if (n == kChunkBytes) {
    const bool stream = stream_next_chunk();
    const auto start = std::chrono::steady_clock::now();
    if (stream) {
      copy_streaming(data_ + offset, source, n);
    } else {
      std::memcpy(data_ + offset, source, n);
    }
    record_chunk(stream, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
  } else {
    std::memcpy(data_ + offset, source, n);
  }
  position_ += n;
  // Sequentially consistent with the reader's sleep_as_reader(): either the
  // reader sees the new head before sleeping, or this side sees its flag.
  control_->head.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->reader_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->reader_asleep.exchange(0) != 0;
  return n;
}

std::size_t ByteRing::read(char* target, std::size_t bytes, bool reduce, DataType dtype, ReduceOp op, bool* wake_peer) {
  const uint64_t head = control_->head.load(std::memory_order_acquire);
  if (head <= position_) return 0;
  const std::size_t offset = position_ % kRingBytes;
  std::size_t n = std::min({bytes, static_cast<std::size_t>(head - position_), kRingBytes - offset, kChunkBytes});
  if (reduce) {
    const std::size_t element = element_size(dtype);
    n -= n % element;
    if (n == 0) return 0;
    reduce_into(target, data_ + offset, n / element, dtype, op);
  } else {
    std::memcpy(target, data_ + offset, n);
  }
  position_ += n;
  control_->tail.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->writer_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->writer_asleep.exchange(0) != 0;
  return n;
}

void ByteRing::end_message() { position_ = align_up(position_); }

bool ByteRing::put(const void* record, std::size_t bytes, bool* wake_peer) {
  if (position_ + bytes > control_->tail.load(std::memory_order_acquire) + kRingBytes) return false;
  std::memcpy(data_ + position_ % kRingBytes, record, bytes);
  position_ += bytes;
  control_->head.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->reader_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->reader_asleep.exchange(0) != 0;
  return true;
}

const void* ByteRing::peek(std::size_t bytes) const {
  if (control_->head.load(std::memory_order_acquire) < position_ + bytes) return nullptr;
  return data_ + position_ % kRingBytes;
}

void ByteRing::consume(std::size_t bytes, bool* wake_peer) {
  position_ += bytes;
  control_->tail.store(position_, std::memory_order_seq_cst);
  *wake_peer = control_->writer_asleep.load(std::memory_order_seq_cst) != 0 &&
               control_->writer_asleep.exchange(0) != 0;
}

bool ByteRing::stream_next_chunk() {
  const double cached = chunk_nanoseconds_[0];
  const double streamed = chunk_nanoseconds_[1];
  if (cached == 0) return false;  // measure both first
  if (streamed == 0) return true;
  const bool faster = cached > kStreamWhenCachedCostsTimes * streamed;
  return ++chunks_ % kProbeEvery == 0 ? !faster : faster;
}

void ByteRing::record_chunk(bool streamed, double nanoseconds) {
  double& smoothed = chunk_nanoseconds_[streamed ? 1 : 0];
  // A copy interrupted by the scheduler (milliseconds on a busy 2-core host)
  // says nothing about the caches: one sample moves the estimate at most 4x.
  if (smoothed > 0) nanoseconds = std::min(nanoseconds, 4 * smoothed);
  smoothed = smoothed == 0 ? nanoseconds : smoothed + (nanoseconds - smoothed) / 8;
}

bool ByteRing::sleep_as_reader() {
  control_->reader_asleep.store(1, std::memory_order_seq_cst);
  if (control_->head.load(std::memory_order_seq_cst) > position_) {
    control_->reader_asleep.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool ByteRing::sleep_as_writer(uint64_t tail) {
  control_->writer_asleep.store(1, std::memory_order_seq_cst);
  if (control_->tail.load(std::memory_order_seq_cst) >= tail) {
    control_->writer_asleep.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

namespace {

// Runs `queue`'s operations through one ring while it moves bytes: `transfer`
// moves what it can of the front operation (setting `wake` when the peer must
// be woken); a finished operation ends its ring message and goes to `finish`.
template <typename Queue, typename Transfer, typename Finish>
bool drain(Queue& queue, ByteRing& ring, bool& wake, Transfer transfer, Finish finish) {
  bool moved = false;
  while (!queue.empty()) {
    auto& op = queue.front();
    bool woken = false;
    const std::size_t n = op.remaining ? transfer(op, &woken) : 0;
    wake |= woken;
    op.data += n;
    op.remaining -= n;
    if (op.remaining > 0) {
      if (n == 0) break;
      moved = true;
      continue;
    }
    ring.end_message();
    finish(op);
    queue.pop_front();
    moved = true;
  }
  return moved;
}

}  // namespace

ShmLink::ShmLink(std::unique_ptr<ShmSegment> segment, bool creator, bool single_copy)
    : segment_(std::move(segment)),
      out_(segment_->outgoing(creator)),
      in_(segment_->incoming(creator)),
      single_copy_(single_copy),
      scratch_(single_copy ? new char[kReferenceChunkBytes] : nullptr) {}

// Sends through the ring, or by reference; a send is done once written, or,
// by reference, once the peer has consumed its reference. Sends complete in
// order, so one written after an unreleased reference waits behind it.
bool ShmLink::progress_sends(LinkQueues& queues, bool* wake) {
  const auto transfer = [&](Operation& op, bool* woken) -> std::size_t {
    if (!by_reference(op)) return out_.write(op.data, op.remaining, woken);
    const Reference reference{kReferenceMagic, reinterpret_cast<uint64_t>(op.data), op.bytes};
    if (!out_.put(&reference, sizeof reference, woken)) return 0;
    queues.awaiting_release.push_back(out_.position());
    return op.remaining;  // all of it handed over
  };
  const auto finish = [&](const Operation& op) {
    if (by_reference(op)) return;  // done once released, below
    if (queues.awaiting_release.empty()) {
      ++queues.sends_done;
    } else {
      queues.awaiting_release.push_back(0);  // done, but after the references before it
    }
  };
  bool moved = drain(queues.sends, out_, *wake, transfer, finish);
  while (!queues.awaiting_release.empty() && out_.released(queues.awaiting_release.front())) {
    queues.awaiting_release.pop_front();
    ++queues.sends_done;
    moved = true;
  }
  return moved;
}

// Reads the next chunk of a message passed by reference straight from the
// writer's memory (reducing through the scratch buffer), and consumes the
// reference with the last chunk.
std::size_t ShmLink::read_by_reference(Operation& op, bool* wake) {
  const auto* reference = static_cast<const Reference*>(in_.peek(sizeof(Reference)));
  if (reference == nullptr) return 0;
  if (reference->magic != kReferenceMagic || reference->bytes != op.bytes) {
    // Sizes are agreed before any transfer (transport.h), so this is a bug, not a peer's failure.
    throw HoraInternalError("A message passed by reference through shared memory does not match the receive "
                            "posted for it (" + std::to_string(op.bytes) + " bytes expected).");
  }
  const uint64_t address = reference->address + (op.bytes - op.remaining);
  const std::size_t n = std::min(op.remaining, kReferenceChunkBytes);
  if (op.reduce) {
    copy_from_peer(segment_->peer_pid(), scratch_.get(), address, n);
    check_not_abandoned();  // before the copy lands anywhere it can be seen
    reduce_into(op.data, scratch_.get(), n / element_size(op.dtype), op.dtype, op.op);
  } else {
    copy_from_peer(segment_->peer_pid(), op.data, address, n);
    check_not_abandoned();
  }
  if (n == op.remaining) in_.consume(sizeof(Reference), wake);
  return n;
}

// Checked after every copy from the peer's memory: the writer marks the ring
// before it lets go of any buffer, so a copy that began after the buffer was
// freed sees the mark here and is thrown away.
void ShmLink::check_not_abandoned() const {
  if (in_.abandoned()) throw LinkLost(": it gave up while this rank was reading a message from its memory");
}

bool ShmLink::progress(LinkQueues& queues, bool* wake_peer) {
  bool wake = false;
  bool moved = progress_sends(queues, &wake);
  const auto transfer = [&](Operation& op, bool* woken) {
    if (by_reference(op)) return read_by_reference(op, woken);
    return in_.read(op.data, op.remaining, op.reduce, op.dtype, op.op, woken);
  };
  moved |= drain(queues.recvs, in_, wake, transfer, [&](const Operation&) { ++queues.recvs_done; });
  *wake_peer = wake;
  return moved;
}

bool ShmLink::sleep(const LinkQueues& queues) {
  bool sleep = true;
  if (!queues.recvs.empty()) sleep &= in_.sleep_as_reader();
  // The writer waits for room in the ring, or else for its first unreleased reference.
  if (!queues.sends.empty()) {
    // A reference goes in whole; bytes through the ring go in as they fit.
    sleep &= out_.sleep_as_writer(out_.tail_for_room(by_reference(queues.sends.front()) ? sizeof(Reference) : 1));
  } else if (!queues.awaiting_release.empty()) {
    sleep &= out_.sleep_as_writer(queues.awaiting_release.front());
  }
  return sleep;
}

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

// Both: probe[address value] in the segment, then wanted[1], then worked[1].
bool agree_single_copy(int tcp_fd, ShmSegment& segment, bool creator, bool wanted, bool only_peer,
                       Clock::time_point deadline) {
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
  return hear(tcp_fd, deadline) && worked;
}

}  // namespace hora
