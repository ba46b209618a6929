// CPU emulation of glai_kernels/csrc/cuda/async_copy.cuh (cp.async; tests only).
//
// Each emulated thread (fiber) keeps its own copies in commit groups. When a copy lands is a
// switch (glai_emulation_set_async_copies), so a test can put a pipeline at both ends of what
// the hardware allows:
//   - deferred (the default): a copy lands only when a wait<N> retires its group, as late
//     as the hardware may deliver it, so a stage read before its wait (or by a thread other
//     than the issuer without a barrier after the wait) sees stale data;
//   - immediate: a copy lands when it is issued (a synchronous copy, as below sm_80), so a
//     stage overwritten while other threads still read it shows.
// Both addresses must be 16-byte aligned, as cp.async's 16-byte form requires; a violation
// fails the launch as a misaligned address would on the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_runtime.h"

namespace glai_async {

struct Copy {
  void* dst;
  const void* src;  // nullptr: 16 zero bytes
};
struct Queue {
  std::vector<Copy> open;                 // issued since the last commit
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};
inline bool deferred = true;
inline std::vector<Queue> queues;  // one per thread of the running block (the fiber's index)

inline Queue& queue() {
  const unsigned t = glai_emulation::current;
  if (queues.size() <= t) queues.resize(t + 1);
  return queues[t];
}

inline void land(const Copy& c) {
  if (c.src != nullptr) {
    std::memcpy(c.dst, c.src, 16);
  } else {
    std::memset(c.dst, 0, 16);
  }
}

inline void copy16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    glai_emulation::sticky_error = cudaErrorMisalignedAddress;
    return;
  }
  const Copy c{dst, valid ? src : nullptr};
  if (deferred) {
    queue().open.push_back(c);
  } else {
    land(c);
  }
}

inline void commit() {
  Queue& q = queue();
  q.groups.push_back(std::move(q.open));
  q.open.clear();
}

template <int N>
void wait() {
  Queue& q = queue();
  while (q.groups.size() > static_cast<size_t>(N)) {
    for (const Copy& c : q.groups.front()) land(c);
    q.groups.erase(q.groups.begin());
  }
}

}  // namespace glai_async

extern "C" void glai_emulation_set_async_copies(int deferred) {  // one TU includes this
  glai_async::deferred = deferred != 0;
  glai_async::queues.clear();
}
