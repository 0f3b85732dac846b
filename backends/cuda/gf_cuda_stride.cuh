// How the blocks of a batched kernel stride over one range of bytes: the batched copy
// (gf_cuda_copy.cu) and the batched comparison (gf_cuda_compare.cu) walk their ranges alike, in
// 16-byte vectors when both ends and the length allow it, else byte by byte.
#ifndef GF_CUDA_STRIDE_CUH
#define GF_CUDA_STRIDE_CUH

#include <stdint.h>

struct gf_cuda_stride {
  unsigned long long start; // this thread's first index
  unsigned long long step;  // the launch's threads along x
  bool vectorised;          // indices count uint4 (up to bytes / 16), else bytes
};

__device__ inline gf_cuda_stride gf_cuda_stride_of(const void *a, const void *b,
                                                   unsigned long long bytes, int threads) {
  return gf_cuda_stride{
      blockIdx.x * (unsigned long long)threads + threadIdx.x,
      gridDim.x * (unsigned long long)threads,
      ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | bytes) & 15u) == 0};
}

#endif // GF_CUDA_STRIDE_CUH
