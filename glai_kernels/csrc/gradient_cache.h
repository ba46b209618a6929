// Gradient results kept, by size, for the next backward when freed.
//
// A fresh large result costs the kernels writing it page faults and the kernel's zeroing of
// every page. glibc maps every block of 32 MiB or more afresh and unmaps it on free (B1's
// 210 MB dweight: 8 of the 14 ms of its dweight at B = 16, two threads), and smaller blocks
// fare no better under autograd: freeing a step's gradients leaves a free top of the heap that
// glibc trims back to the OS, so the next step faults it in again (A1 at B = 16: 24-35 faults
// and +15% on the median step, C1 28-54 faults and p90 2.7x the median; docs/notes/cpu-kernels.md,
// "Gradients kept from 256 KiB"). In training the gradients are freed each step (zero_grad,
// or the caller dropping them) and the next backward asks for the same sizes again: this
// keeps freed results of at least kMinBytes (at most 1 GiB in all, the oldest freed first) and hands them
// back, already faulted in, with transparent huge pages asked for from 4 MiB. Values are never
// relied on: the kernels write every element of a result.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glai_cache {

// A new contiguous tensor of `sizes` and `options` (CPU): from the kept blocks when it is
// at least kMinBytes, else at::empty.
at::Tensor empty_result(at::IntArrayRef sizes, const at::TensorOptions& options);

// Frees every kept block; returns the bytes released.
int64_t release();

// Bytes kept now (a test hook).
int64_t held_bytes();

// Sets the most bytes kept (1 GiB unless set; the oldest blocks are freed past it) when
// `bytes` >= 0; returns the limit before the call (a test hook).
int64_t held_limit(int64_t bytes);

}  // namespace glai_cache
