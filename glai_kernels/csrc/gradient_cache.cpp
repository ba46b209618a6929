// glai_cache (gradient_cache.h): freed large results kept, by size, for the next backward.
#include "gradient_cache.h"

#include "cpu/kernels.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace glai_cache {
namespace {

// with this bound no step at the paper's B = 16 faults a page (docs/notes/cpu-kernels.md, as in the
// header)
constexpr int64_t kMinBytes = int64_t{256} << 10;
constexpr int64_t kMaxHeldBytes = int64_t{1} << 30;  // kept blocks, all sizes together
constexpr uintptr_t kHuge = uintptr_t{2} << 20;

// Asks for transparent huge pages under [p, p + bytes)'s 2 MiB-aligned interior: one fault
// per 2 MiB instead of per 4 KiB. Advice changes no value; failure (no THP) is ignored.
void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

class Blocks {
 public:
  // the most recently kept block of this size
  void* take(int64_t bytes) {
    const std::lock_guard<std::mutex> guard(lock_);
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if (it->first == bytes) {
        void* p = it->second;
        free_.erase(std::next(it).base());
        held_ -= bytes;
        return p;
      }
    }
    return nullptr;
  }
  // Keeps p; when the kept blocks would pass the limit, the oldest go first (a program whose
  // shapes change keeps the blocks of its current ones). A block larger than the limit is
  // freed at once.
  void give(void* p, int64_t bytes) {
    std::vector<void*> evicted;
    {
      const std::lock_guard<std::mutex> guard(lock_);
      if (bytes <= limit_) {
        evict_oldest(limit_ - bytes, &evicted);
        free_.emplace_back(bytes, p);
        held_ += bytes;
      } else {
        evicted.push_back(p);
      }
    }
    for (void* q : evicted) std::free(q);
  }
  int64_t set_limit(int64_t bytes) {
    std::vector<void*> evicted;
    int64_t previous;
    {
      const std::lock_guard<std::mutex> guard(lock_);
      previous = limit_;
      if (bytes >= 0) {
        limit_ = bytes;
        evict_oldest(limit_, &evicted);
      }
    }
    for (void* q : evicted) std::free(q);
    return previous;
  }
  int64_t release() {
    std::vector<std::pair<int64_t, void*>> blocks;
    {
      const std::lock_guard<std::mutex> guard(lock_);
      blocks.swap(free_);
      held_ = 0;
    }
    int64_t bytes = 0;
    for (const auto& [size, p] : blocks) {
      bytes += size;
      std::free(p);
    }
    return bytes;
  }
  int64_t held() {
    const std::lock_guard<std::mutex> guard(lock_);
    return held_;
  }

 private:
  // Drops the oldest kept blocks until at most `most` bytes are held (lock_ held); the
  // caller frees them after unlocking.
  void evict_oldest(int64_t most, std::vector<void*>* evicted) {
    size_t oldest = 0;
    while (held_ > most) {
      held_ -= free_[oldest].first;
      evicted->push_back(free_[oldest++].second);
    }
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(oldest));
  }

  std::mutex lock_;
  std::vector<std::pair<int64_t, void*>> free_;  // oldest first
  int64_t held_ = 0;
  int64_t limit_ = kMaxHeldBytes;
};

// Never destroyed: a result may be freed after static destructors have run.
Blocks& blocks() {
  static auto* b = new Blocks();
  return *b;
}

}  // namespace

// A block of `bytes` from the kept ones, else new (huge pages asked for from 4 MiB); null when
// out of memory.
static void* take_block(int64_t bytes) {
  void* p = blocks().take(bytes);
  if (p == nullptr) {
    const size_t align = bytes >= static_cast<int64_t>(2 * kHuge) ? kHuge : 64;
    if (posix_memalign(&p, align, static_cast<size_t>(bytes)) != 0) return nullptr;
    advise_huge_pages(p, bytes);
  }
  return p;
}

at::Tensor empty_result(at::IntArrayRef sizes, const at::TensorOptions& options) {
  int64_t numel = 1;
  for (const int64_t d : sizes) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  if (bytes < kMinBytes) return at::empty(sizes, options);
  void* p = take_block(bytes);
  TORCH_CHECK(p != nullptr, "glai_ext: out of memory for a result of ", bytes, " bytes");
  return at::from_blob(
      p, sizes, [bytes](void* q) { blocks().give(q, bytes); }, options);
}

int64_t release() { return blocks().release(); }

int64_t held_bytes() { return blocks().held(); }

int64_t held_limit(int64_t bytes) { return blocks().set_limit(bytes); }

}  // namespace glai_cache

namespace glai_cpu {

// below the kept blocks' bound: plain memory, as the kernels' other scratch
void* alloc_kept(int64_t bytes) {
  if (bytes < glai_cache::kMinBytes) return std::aligned_alloc(64, static_cast<size_t>(bytes));
  return glai_cache::take_block(bytes);
}

void free_kept(void* p, int64_t bytes) {
  if (p == nullptr) return;
  if (bytes < glai_cache::kMinBytes) return std::free(p);
  glai_cache::blocks().give(p, bytes);
}

}  // namespace glai_cpu
