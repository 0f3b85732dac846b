// The batched comparison of verify mode (see gf_cuda_compare.h). The pair table travels as a
// kernel parameter (64 pairs: 1.5 KiB, under the 4 KiB every architecture accepts). blockIdx.y
// picks the pair; the blocks along x stride over its bytes in 16-byte vectors when both ends and
// the length allow it, else byte by byte. A block that finds a difference sets scratch[0]; every
// block then counts itself done in scratch[1], and the one that counts last (of every launch of
// the comparison: the launches of one stream run in order) writes the verdict to the host byte
// and zeroes both words for the comparison's next use.
#include "gf_cuda_compare.h"
#include "gf_cuda_copy.h"
#include "gf_cuda_stride.cuh"

#include <cuda_runtime.h>

#include <stdint.h>

namespace {

struct CompareTable {
  const void *left[GF_CUDA_COMPARES_PER_LAUNCH];
  const void *right[GF_CUDA_COMPARES_PER_LAUNCH];
  unsigned long long bytes[GF_CUDA_COMPARES_PER_LAUNCH];
};

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocksPerPair = 256;

__device__ bool differs(const char *left, const char *right, unsigned long long bytes) {
  const gf_cuda_stride stride = gf_cuda_stride_of(left, right, bytes, kThreads);
  if (stride.vectorised) {
    const uint4 *left4 = reinterpret_cast<const uint4 *>(left);
    const uint4 *right4 = reinterpret_cast<const uint4 *>(right);
    for (unsigned long long i = stride.start; i < bytes / 16; i += stride.step) {
      const uint4 a = left4[i];
      const uint4 b = right4[i];
      if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
        return true;
      }
    }
    return false;
  }
  for (unsigned long long i = stride.start; i < bytes; i += stride.step) {
    if (left[i] != right[i]) {
      return true;
    }
  }
  return false;
}

__global__ void gf_compare_kernel(const CompareTable table, unsigned total_blocks, uint8_t *verdict,
                                  uint32_t *scratch) {
  const unsigned pair = blockIdx.y;
  const int block_found =
      __syncthreads_or(differs(static_cast<const char *>(table.left[pair]),
                               static_cast<const char *>(table.right[pair]), table.bytes[pair]));
  if (threadIdx.x != 0) {
    return;
  }
  if (block_found) {
    atomicOr(&scratch[0], 1u);
  }
  __threadfence(); // this block's finding is seen before its count
  if (atomicAdd(&scratch[1], 1u) + 1 == total_blocks) {
    const uint32_t found_any = atomicExch(&scratch[0], 0u);
    atomicExch(&scratch[1], 0u);
    *reinterpret_cast<volatile uint8_t *>(verdict) = found_any != 0 ? 1 : 0;
    __threadfence_system();
  }
}

unsigned blocks_per_pair(const gf_copy *pairs, size_t count) {
  return gf_cuda_blocks_per_range(pairs, count, kMaxBlocksPerPair);
}

size_t chunk_at(size_t first, size_t count) {
  return count - first < GF_CUDA_COMPARES_PER_LAUNCH
             ? count - first
             : static_cast<size_t>(GF_CUDA_COMPARES_PER_LAUNCH);
}

} // namespace

extern "C" int gf_cuda_compare_later(const gf_copy *pairs, size_t count, uint8_t *verdict,
                                     uint32_t *scratch, cudaStream_t stream) {
  if (count == 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  void *device_verdict = nullptr;
  if (cudaHostGetDevicePointer(&device_verdict, verdict, 0) != cudaSuccess) {
    cudaGetLastError(); // not pinned, or not mapped: the caller compares another way
    return static_cast<int>(cudaErrorInvalidValue);
  }
  unsigned long long total_blocks = 0;
  for (size_t first = 0; first < count; first += GF_CUDA_COMPARES_PER_LAUNCH) {
    const size_t chunk = chunk_at(first, count);
    total_blocks += static_cast<unsigned long long>(blocks_per_pair(pairs + first, chunk)) * chunk;
  }
  for (size_t first = 0; first < count; first += GF_CUDA_COMPARES_PER_LAUNCH) {
    const size_t chunk = chunk_at(first, count);
    CompareTable table = {};
    for (size_t i = 0; i < chunk; ++i) {
      table.left[i] = pairs[first + i].dst;
      table.right[i] = pairs[first + i].src;
      table.bytes[i] = pairs[first + i].bytes;
    }
    const dim3 grid(blocks_per_pair(pairs + first, chunk), static_cast<unsigned>(chunk));
    gf_compare_kernel<<<grid, kThreads, 0, stream>>>(table, static_cast<unsigned>(total_blocks),
                                                     static_cast<uint8_t *>(device_verdict),
                                                     scratch);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
      return static_cast<int>(error);
    }
  }
  return 0;
}
