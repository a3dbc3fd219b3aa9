#include "shm_link.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "errors.h"
#include "huge_pages.h"
#include "reduce.h"
#include "tcp_socket.h"

namespace hora {
namespace {

// Bytes a read by reference takes per system call (and the scratch buffer's
// size): the call pins the peer's pages one by one, so fewer, larger calls.
constexpr std::size_t kReferenceChunkBytes = 256 * 1024;

// What the ring carries first for a message that may cross by reference:
// a reference to it in the writer's memory (the whole message, in the
// ring), or word that its bytes follow through the ring (from the next
// aligned position).
struct Header {
  uint64_t magic;
  uint64_t address;  // of the message in the writer's memory (by reference)
  uint64_t bytes;
};
constexpr uint64_t kReferenceMagic = 0x686f72612d726566;  // "hora-ref"
constexpr uint64_t kInlineMagic = 0x686f72612d696e6c;     // "hora-inl"
static_assert(sizeof(Header) <= kMessageAlign, "a header must fit one aligned slot");
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
    if (op.own != nullptr) op.own += n;
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

ShmLink::ShmLink(std::unique_ptr<ShmSegment> segment, bool creator, bool single_copy,
                 std::size_t single_copy_buffer_bytes)
    : segment_(std::move(segment)),
      out_(segment_->outgoing(creator)),
      in_(segment_->incoming(creator)),
      single_copy_(single_copy),
      single_copy_buffer_bytes_(single_copy_buffer_bytes),
      scratch_(single_copy ? new char[kReferenceChunkBytes] : nullptr) {}

void ShmLink::prepare(Operation& op, bool is_send, std::size_t working_set) const {
  op.announced = may_pass_by_reference(op.bytes, working_set);
  op.header_passed = false;
  op.by_reference = op.announced && is_send && on_huge_pages(op.data, op.bytes).value_or(true);
}

// Sends through the ring, or by reference; a send is done once written, or,
// by reference, once the peer has consumed its reference. Sends complete in
// order, so one written after an unreleased reference waits behind it.
bool ShmLink::progress_sends(LinkQueues& queues, bool* wake) {
  const auto transfer = [&](Operation& op, bool* woken) -> std::size_t {
    if (op.announced && !op.header_passed) {
      const Header header{op.by_reference ? kReferenceMagic : kInlineMagic, reinterpret_cast<uint64_t>(op.data),
                          op.bytes};
      if (!out_.put(&header, sizeof header, woken)) return 0;
      op.header_passed = true;
      if (op.by_reference) {
        queues.awaiting_release.push_back(out_.position());
        ++queues.sent_by_reference;
        return op.remaining;  // all of it handed over
      }
      out_.end_message();  // the bytes start at the next aligned position
    }
    bool written_woken = false;
    const std::size_t n = out_.write(op.data, op.remaining, &written_woken);
    *woken |= written_woken;
    return n;
  };
  const auto finish = [&](const Operation& op) {
    if (op.by_reference) return;  // done once released, below
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

// Reads the header of a message that may come by reference once it has
// arrived: a reference stays in the ring until the message is read; word
// that the bytes follow is consumed at once. Returns whether it was there.
bool ShmLink::read_header(Operation& op, bool* wake) {
  const auto* header = static_cast<const Header*>(in_.peek(sizeof(Header)));
  if (header == nullptr) return false;
  if ((header->magic != kReferenceMagic && header->magic != kInlineMagic) || header->bytes != op.bytes) {
    // Sizes are agreed before any transfer (transport.h), so this is a bug, not a peer's failure.
    throw HoraInternalError("A message that may pass by reference through shared memory does not match the "
                            "receive posted for it (" + std::to_string(op.bytes) + " bytes expected).");
  }
  op.header_passed = true;
  op.by_reference = header->magic == kReferenceMagic;
  if (!op.by_reference) {
    in_.consume(sizeof(Header), wake);
    in_.end_message();
  }
  return true;
}

// Reads the next chunk of a message passed by reference straight from the
// writer's memory (reducing through the scratch buffer), and consumes the
// reference with the last chunk.
std::size_t ShmLink::read_by_reference(Operation& op, bool* wake) {
  // read_header() saw this reference whole, and only the last chunk consumes it, so it is still there.
  const auto* reference = static_cast<const Header*>(in_.peek(sizeof(Header)));
  if (reference == nullptr) {
    throw HoraInternalError("The reference to a message of " + std::to_string(op.bytes) +
                            " bytes left the shared-memory ring before its last chunk was read.");
  }
  const uint64_t address = reference->address + (op.bytes - op.remaining);
  const std::size_t n = std::min(op.remaining, kReferenceChunkBytes);
  if (op.reduce) {
    copy_from_peer(segment_->peer_pid(), scratch_.get(), address, n);
    check_not_abandoned();  // before the copy lands anywhere it can be seen
    reduce_into(op.data, scratch_.get(), n / element_size(op.dtype), op.dtype, op.op, op.factor, op.own);
  } else {
    copy_from_peer(segment_->peer_pid(), op.data, address, n);
    check_not_abandoned();
  }
  if (n == op.remaining) in_.consume(sizeof(Header), wake);
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
  const auto transfer = [&](Operation& op, bool* woken) -> std::size_t {
    if (op.announced && !op.header_passed && !read_header(op, woken)) return 0;
    if (op.by_reference) return read_by_reference(op, woken);
    bool read_woken = false;
    const std::size_t n = in_.read(op.data, op.remaining, op.reduce, op.dtype, op.op, op.factor, op.own, &read_woken);
    *woken |= read_woken;
    return n;
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
    // A header goes in whole; bytes through the ring go in as they fit.
    const Operation& front = queues.sends.front();
    sleep &= out_.sleep_as_writer(out_.tail_for_room(front.announced && !front.header_passed ? sizeof(Header) : 1));
  } else if (!queues.awaiting_release.empty()) {
    sleep &= out_.sleep_as_writer(queues.awaiting_release.front());
  }
  return sleep;
}

}  // namespace hora
