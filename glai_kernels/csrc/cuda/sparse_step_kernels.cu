// The fused sparse training step's CUDA kernels (interface and formula: sparse_step_kernels.cuh).
//
// dvalues + Adam: blocks of 256 threads shaped (lanes, rows), sparse_kernels.cu's dvalues loop
// (entry_sums.cuh): the lanes run over the batch (8, 16 or 32, the smallest that covers B), each
// row takes 4 entries per step (grid-stride over K), and each entry's lane partial sums go
// through shared memory to one thread, which adds them in lane order and, with the gradient in
// a register, updates that entry's value and moments. So dv [K] is never written, and the update's
// reads and writes of values, m, v (24 bytes an entry in float32) are the pass's only extra
// traffic. The bias: one thread per output sums dy's column in batch order, then updates.
// Index values are int32 (layout.py); every address built from them is int64.
#include <math.h>

#include "sparse_step_kernels.cuh"
#include "entry_sums.cuh"

namespace {

// nvcc launches with <<< >>>; the tests compile this file as C++ against a CPU emulation of the
// CUDA runtime (correctness/cuda_emulation), which launches through glai_emulated_launch.
#ifdef GLAI_CUDA_EMULATION
#define GLAI_STEP_LAUNCH(kernel, grid, block, stream, ...) \
  glai_emulated_launch(kernel, grid, block, stream, __VA_ARGS__)
#else
#define GLAI_STEP_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<grid, block, 0, stream>>>(__VA_ARGS__)
#endif

constexpr int kThreads = 256;
using glai_cuda_sparse::cdiv;
using glai_cuda_sparse::kEntriesPerRow;
// Blocks of 256 per SM asked of ptxas: 6 in float32, as sparse_kernels.cu's dvalues (occupancy
// hides the gathers' latency; up to 40 registers); 4 in float64, whose update (the double
// pow of the bias corrections) spilled 24 bytes on sm_80 in 40 registers
template <typename T>
struct BlocksPerSm {
  static constexpr int value = sizeof(T) == 8 ? 4 : 6;
};

// One update's scalars in the parameter's dtype (torch's fused Adam: computed in double).
template <typename T>
struct Scalars {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, weight_decay, eps, step_size,
      bias_correction2_sqrt, decay_scale;
  bool decoupled;
};

template <typename T>
__device__ Scalars<T> scalars(const glai_adam_step& a) {
  const double n = a.step_on_device != nullptr ? static_cast<double>(*a.step_on_device) : a.step;
  const double bias_correction1 = 1.0 - pow(a.beta1, n);
  const double bias_correction2 = 1.0 - pow(a.beta2, n);
  return {T(a.beta1),         T(a.beta2),
          T(1.0 - a.beta1),   T(1.0 - a.beta2),
          T(a.weight_decay),  T(a.eps),
          T(a.lr / bias_correction1), T(sqrt(bias_correction2)),
          T(1.0 - a.lr * a.weight_decay), a.decoupled != 0};
}

// One element: the formula in torch's order of operations (the CPU kernels' adam_lanes).
template <typename T>
__device__ void adam(const Scalars<T>& s, T g, T* w, T* m, T* v) {
  T value = *w;
  if (s.decoupled) {
    value = value * s.decay_scale;
  } else {
    g = g + value * s.weight_decay;
  }
  const T mk = *m * s.beta1 + g * s.one_minus_beta1;
  const T vk = *v * s.beta2 + g * g * s.one_minus_beta2;
  value = value - s.step_size * mk / (sqrt(vk) / s.bias_correction2_sqrt + s.eps);
  *w = value;
  *m = mk;
  *v = vk;
}

template <typename T>
struct StepArgs {
  const T* xt;    // [I, B]
  const T* actt;  // [P, B]
  const T* dyt;   // [O, B]
  const int32_t* inputs;
  const int32_t* group_outputs;
  const int32_t* group_paths;
  const int32_t* entry_groups;
  int64_t B, K;
  T* w;
  T* m;
  T* v;
  glai_adam_step step;

  __device__ T at(const T* t, int32_t r, int64_t b) const {
    return t[static_cast<int64_t>(r) * B + b];
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, BlocksPerSm<T>::value)
    dvalues_adam_kernel(StepArgs<T> a) {
  __shared__ T scratch[kEntriesPerRow * kThreads];
  const Scalars<T> s = scalars<T>(a.step);
  // the thread that summed entry k's gradient updates it: consecutive threads, consecutive
  // entries, so the reads and writes of w, m, v are coalesced
  glai_cuda_sparse::for_each_entry_sum(a, scratch, [&](int64_t k, T grad) {
    adam<T>(s, grad, a.w + k, a.m + k, a.v + k);
  });
}

template <typename T>
__global__ void __launch_bounds__(kThreads) bias_adam_kernel(const T* __restrict__ dy,
                                                             int64_t batch, int64_t outputs,
                                                             T* w, T* m, T* v,
                                                             glai_adam_step step) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= outputs) return;
  const Scalars<T> s = scalars<T>(step);
  T grad = T(0);
  // consecutive threads read consecutive outputs of a row: coalesced
  for (int64_t b = 0; b < batch; ++b) grad += dy[b * outputs + o];
  adam<T>(s, grad, w + o, m + o, v + o);
}

// ---- host side ------------------------------------------------------------------------------

bool hyper_ok(const glai_adam_step* a) {
  return a != nullptr && a->lr >= 0 && a->eps >= 0 && a->weight_decay >= 0 && a->beta1 >= 0 &&
         a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 &&
         (a->step_on_device != nullptr || a->step >= 1);
}

template <typename T>
cudaError_t dvalues_adam_typed(const glai_sparse_problem& p, void* values, void* exp_avg,
                               void* exp_avg_sq, const glai_adam_step& step,
                               cudaStream_t stream) {
  const StepArgs<T> a{static_cast<const T*>(p.xt), static_cast<const T*>(p.actt),
                      static_cast<const T*>(p.dyt), p.inputs, p.group_outputs, p.group_paths,
                      p.entry_groups, p.batch, p.nnz, static_cast<T*>(values),
                      static_cast<T*>(exp_avg), static_cast<T*>(exp_avg_sq), step};
  dim3 grid, block;
  glai_cuda_sparse::entry_launch(p.nnz, p.batch, kThreads, &grid, &block);
  auto* kernel = &dvalues_adam_kernel<T>;
  GLAI_STEP_LAUNCH(kernel, grid, block, stream, a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t bias_adam_typed(const void* dy, int64_t batch, int64_t outputs, void* bias,
                            void* exp_avg, void* exp_avg_sq, const glai_adam_step& step,
                            cudaStream_t stream) {
  const int64_t blocks = cdiv(outputs, kThreads);
  if (blocks > 2147483647LL) return cudaErrorInvalidValue;
  auto* kernel = &bias_adam_kernel<T>;
  GLAI_STEP_LAUNCH(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream,
                   static_cast<const T*>(dy), batch, outputs, static_cast<T*>(bias),
                   static_cast<T*>(exp_avg), static_cast<T*>(exp_avg_sq), step);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t glai_sparse_dvalues_adam(const glai_sparse_problem* p, void* values,
                                                void* exp_avg, void* exp_avg_sq,
                                                const glai_adam_step* a, cudaStream_t stream) {
  if (p == nullptr || !hyper_ok(a) || p->batch < 0 || p->nnz < 0) return cudaErrorInvalidValue;
  if (p->nnz == 0) return cudaSuccess;
  if (values == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr)
    return cudaErrorInvalidValue;
  // with B = 0 every gradient is an empty sum: the kernel updates with g = 0, as the CPU op
  if (p->batch > 0 && (p->dyt == nullptr || p->xt == nullptr || p->actt == nullptr))
    return cudaErrorInvalidValue;
  switch (p->dtype) {
    case GLAI_FLOAT32:
      return dvalues_adam_typed<float>(*p, values, exp_avg, exp_avg_sq, *a, stream);
    case GLAI_FLOAT64:
      return dvalues_adam_typed<double>(*p, values, exp_avg, exp_avg_sq, *a, stream);
    default: return cudaErrorInvalidValue;  // the update is in the parameter's own dtype
  }
}

extern "C" cudaError_t glai_bias_adam(const void* dy, int64_t batch, int64_t outputs,
                                      glai_dtype dtype, void* bias, void* exp_avg,
                                      void* exp_avg_sq, const glai_adam_step* a,
                                      cudaStream_t stream) {
  if (!hyper_ok(a) || batch < 0 || outputs < 0) return cudaErrorInvalidValue;
  if (outputs == 0) return cudaSuccess;
  if (bias == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr ||
      (batch > 0 && dy == nullptr))
    return cudaErrorInvalidValue;
  switch (dtype) {
    case GLAI_FLOAT32:
      return bias_adam_typed<float>(dy, batch, outputs, bias, exp_avg, exp_avg_sq, *a, stream);
    case GLAI_FLOAT64:
      return bias_adam_typed<double>(dy, batch, outputs, bias, exp_avg, exp_avg_sq, *a, stream);
    default: return cudaErrorInvalidValue;
  }
}
