#include "huge_pages.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>

namespace hora {
namespace {

// PAGEMAP_SCAN's interface (linux/fs.h since 6.7), written out so the build
// does not depend on the headers' age; the kernel checks `size`.
struct PageRegion {
  uint64_t start;
  uint64_t end;
  uint64_t categories;
};
struct PageScan {
  uint64_t size;
  uint64_t flags;
  uint64_t start;
  uint64_t end;
  uint64_t walk_end;
  uint64_t vec;
  uint64_t vec_len;
  uint64_t max_pages;
  uint64_t category_inverted;
  uint64_t category_mask;
  uint64_t category_anyof_mask;
  uint64_t return_mask;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PageScan);
constexpr uint64_t kPageIsHuge = 1 << 6;
constexpr int kRegions = 16;

// /proc/self/pagemap, opened once per process: a descriptor inherited
// across fork() would describe the parent, so a child opens its own. -1:
// the kernel cannot scan page tables (or /proc is not there).
class Pagemap {
 public:
  // The descriptor to ask, or -1; `unsupported` once the kernel said so.
  int descriptor() {
    const pid_t pid = ::getpid();
    if (pid == pid_) return fd_;
    if (fd_ >= 0) ::close(fd_);
    fd_ = unsupported_ ? -1 : ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    pid_ = pid;
    return fd_;
  }
  void unsupported() {
    unsupported_ = true;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::mutex mutex;

 private:
  int fd_ = -1;
  pid_t pid_ = 0;
  bool unsupported_ = false;
};

Pagemap& pagemap() {
  static Pagemap* instance = new Pagemap;  // never destroyed: transports may run during exit
  return *instance;
}

}  // namespace

std::optional<bool> on_huge_pages(const void* data, std::size_t bytes) {
  if (bytes == 0) return false;
  // The scan takes page-aligned bounds: the base page, not 4 KiB (arm64 kernels may use 16 or 64 KiB).
  static const uint64_t kPageBytes = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uint64_t>(data);
  const uint64_t end = (begin + bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  Pagemap& map = pagemap();
  std::lock_guard<std::mutex> lock(map.mutex);
  const int fd = map.descriptor();
  if (fd < 0) return std::nullopt;
  PageRegion regions[kRegions];
  uint64_t huge = 0;
  uint64_t at = begin / kPageBytes * kPageBytes;
  while (at < end) {
    PageScan scan{sizeof(PageScan), 0, at, end, 0, reinterpret_cast<uint64_t>(regions), kRegions, 0, 0,
                  kPageIsHuge, 0, kPageIsHuge};
    const int found = ::ioctl(fd, kPagemapScan, &scan);
    if (found < 0) {
      if (errno == ENOTTY || errno == EINVAL || errno == EPERM || errno == EACCES) map.unsupported();
      return std::nullopt;
    }
    for (int i = 0; i < found; ++i) {
      const uint64_t from = regions[i].start < begin ? begin : regions[i].start;
      const uint64_t to = regions[i].end > begin + bytes ? begin + bytes : regions[i].end;
      if (to > from) huge += to - from;
    }
    if (scan.walk_end <= at) break;
    at = scan.walk_end;
  }
  return huge * 2 >= bytes;
}

}  // namespace hora
