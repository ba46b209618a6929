// Result tensors for gradients the size of the weight, kept for the next backward when freed.
//
// A tensor of 32 MiB or more is fresh memory from the OS on every allocation (glibc maps it
// and unmaps it on free), so the kernels writing B1's 210 MB dweight first paid the kernel's
// page faults and its zeroing of every page: 8 of the 14 ms of B1's dweight at B = 16 on two
// threads (bench/NOTES.md, "The paper's batch at two threads"). In training the gradient is
// freed each step (zero_grad, or the caller dropping it) and the next backward asks for the
// same size again: this keeps freed blocks of those sizes (at most kMaxHeldBytes in all) and
// hands them back, already faulted in, with transparent huge pages asked for. Values are never
// relied on: the kernels write every element of a result.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glai_cache {

// A new contiguous tensor of `sizes` and `options` (CPU): from the kept blocks when it is
// large, else at::empty (with huge pages asked for under its 2 MiB-aligned interior).
at::Tensor empty_result(at::IntArrayRef sizes, const at::TensorOptions& options);

// Frees every kept block; returns the bytes released.
int64_t release();

// Bytes kept now (a test hook).
int64_t held_bytes();

}  // namespace glai_cache
