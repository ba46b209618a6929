// The sparse kept-path estimator's CPU kernels: raw pointers and sizes, no torch headers.
//
// The index is glai_kernels/sparse/layout.py's KeptIndex (int32; entries sorted by (o, s, i)
// and grouped by (o, s), CSR offsets plus reverse orders for dx and dact). The batch runs on
// the vector lanes: the binding hands the kernels x, act and dy transposed, [rows, ld] with
// ld = B rounded up to kBatchPad (zero padded), so a kept entry is one contiguous load of B
// values. Each kernel computes a range of its items (outputs, groups, inputs or paths); every
// result element belongs to one item and is summed in a fixed order, so the binding may split
// the items over threads any way it likes and the bits stay the same.
//
// Kernels never trust the index: every offset and index is range-checked before it is used
// (a bad one is skipped and reported by a non-zero return), so a corrupt index cannot make
// them read or write outside their buffers, except where a kernel's comment names a check the
// caller runs first (groups_in_range: one pass over G per call, cheaper than a check per
// entry in the hot loop). The forward and dvalues at one to five vectors of batch check their
// call's group offsets, paths and outputs in one pass first (sparse_kernels.inc, groups_ok)
// and, where it passes, run a group loop without those checks; where it fails, the checked one.
#pragma once

#include <cstdint>

namespace glai_cpu::sparse {

// ld is a multiple of this many elements: every instruction set's lane count for float and
// double divides it, so every row is whole vectors.
constexpr int64_t kBatchPad = 16;

template <typename T>
struct Problem {
  int64_t batch;  // B
  int64_t ld;     // the row length of xt, actt, dyt and zg: B rounded up to kBatchPad
  int64_t inputs, paths, outputs, nnz, groups;  // I, P, O, K, G
  const T* xt;      // [I, ld]
  const T* actt;    // [P, ld]
  const T* dyt;     // [O, ld] (backward only)
  const T* values;  // [K]
  // the KeptIndex tensors (layout.py)
  const int32_t* inputs_of;      // [K]   i of entry k
  const int32_t* group_ptr;      // [G+1]
  const int32_t* group_outputs;  // [G]
  const int32_t* group_paths;    // [G]
  const int32_t* output_ptr;     // [O+1]
  const int32_t* input_ptr;      // [I+1]
  const int32_t* input_entries;  // [K]
  const int32_t* entry_groups;   // [K]
  const int32_t* path_ptr;       // [P+1]
  const int32_t* path_groups;    // [G]
};

// One Adam / AdamW update of n kept values (torch.optim.Adam's formula, without amsgrad or
// maximize): g = grad (+ weight_decay * value for Adam; AdamW first scales the value by
// 1 - lr * weight_decay), m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g g,
// value -= step_size m / (sqrt(v) / bias_correction2_sqrt + eps). The scalars are torch's,
// computed in double from the step count by the binding and rounded to T.
template <typename T>
struct AdamStep {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, weight_decay, eps, step_size,
      bias_correction2_sqrt, decay_scale;  // decay_scale: AdamW's 1 - lr * weight_decay
  bool decoupled;                          // AdamW
};

// Each returns 0, or 1 when it met an index or offset out of range (the results are then
// meaningless but every access stayed in bounds).
template <typename T>
struct Kernels {
  // Outputs [begin, end): y [B, O] if not null (y[b, o] = sum_g act[b, s_g] Zg[g, b], groups
  // in order) and the group sums zg [G, ld] of their groups if not null. The caller checks
  // groups_in_range first when zg is null (the kernel checks each group's inputs itself).
  int (*forward)(const Problem<T>& p, T* y, T* zg, int64_t begin, int64_t end);
  // Groups [begin, end): dvalues[k] = sum_b dy[b, o_g] act[b, s_g] x[b, i_k] for their entries.
  int (*dvalues)(const Problem<T>& p, T* dvalues, int64_t begin, int64_t end);
  // Inputs [begin, end): dx [B, I], dx[b, i] = sum over i's entries of v dy[b, o] act[b, s].
  // The caller checks group_outputs and group_paths first (groups_in_range): dx does not.
  int (*dx)(const Problem<T>& p, T* dx, int64_t begin, int64_t end);
  // Paths [begin, end): dact [B, P], dact[b, s] = sum over s's groups of dy[b, o_g] zg[g, b].
  int (*dact)(const Problem<T>& p, const T* zg, T* dact, int64_t begin, int64_t end);
  // values, m, v [n] updated in place from their gradient g [n] (every element by the same
  // vector operations, so its bits do not depend on where a chunk starts).
  void (*adam)(const AdamStep<T>& a, T* values, T* m, T* v, const T* g, int64_t n);
  // out [n, ld] = in [batch, n] transposed, out's columns from batch to ld zero (ld a
  // multiple of kBatchPad): the binding's xt, actt and dyt.
  void (*transpose)(const T* in, T* out, int64_t batch, int64_t n, int64_t ld);
};

// Whether every group's output and path is in range: one pass over G, which dx needs first.
template <typename T>
bool groups_in_range(const Problem<T>& p) {
  uint32_t over = 0;
  for (int64_t g = 0; g < p.groups; ++g)
    over |= (static_cast<uint32_t>(p.group_outputs[g]) >= static_cast<uint64_t>(p.outputs)) |
            (static_cast<uint32_t>(p.group_paths[g]) >= static_cast<uint64_t>(p.paths));
  return over == 0;
}

// The kernels of the instruction set that glai_cpu::isa() (cpu_dispatch.cpp) names: the same
// run-time choice, $GLAI_KERNELS_CPU_ISA and glai_ext::cpu_isa as the dense kernels.
template <typename T>
const Kernels<T>& kernels();

}  // namespace glai_cpu::sparse
