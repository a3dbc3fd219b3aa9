// Whether a buffer lies on huge pages, as the kernel's page tables say.
//
// Single copy (shm_link.h) pays only there: process_vm_readv pins the
// writer's pages one by one, which on 4 KiB pages costs more than the copy
// it saves (bench/peers.py and the training benchmarks, docs/performance.md).
// numpy backs its large arrays with transparent huge pages; torch's and
// TensorFlow's CPU allocators do not.
#pragma once

#include <cstddef>
#include <optional>

namespace hora {

// Whether at least half of [data, data + bytes) is mapped by huge pages
// (transparent or hugetlb) right now; nullopt where the kernel cannot say
// (PAGEMAP_SCAN, Linux 6.7 and later, or /proc unreadable). One ioctl on
// /proc/self/pagemap, a walk of the range's page tables, no copy.
std::optional<bool> on_huge_pages(const void* data, std::size_t bytes);

}  // namespace hora
