// The batched copy kernel (see gf_cuda_copy.h). The copy table travels as a kernel parameter
// (3 KiB for 128 copies, under the 4 KiB every architecture accepts), so a launch needs no host-to-
// device upload of its own. blockIdx.y picks the copy; the blocks along x stride over its bytes in
// 16-byte vectors when both ends and the length allow it, else byte by byte.
#include "gf_cuda_copy.h"

#include <cuda_runtime.h>

#include <stdint.h>

namespace {

struct CopyTable {
  const void *src[GF_CUDA_COPIES_PER_LAUNCH];
  void *dst[GF_CUDA_COPIES_PER_LAUNCH];
  unsigned long long bytes[GF_CUDA_COPIES_PER_LAUNCH];
};

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocksPerCopy = 1024;

__global__ void gf_copy_kernel(const CopyTable table) {
  const unsigned copy = blockIdx.y;
  const unsigned long long bytes = table.bytes[copy];
  const char *src = static_cast<const char *>(table.src[copy]);
  char *dst = static_cast<char *>(table.dst[copy]);
  const unsigned long long start = blockIdx.x * (unsigned long long)kThreads + threadIdx.x;
  const unsigned long long step = gridDim.x * (unsigned long long)kThreads;
  const bool vectorised =
      ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | bytes) & 15u) == 0;
  if (vectorised) {
    const uint4 *src4 = reinterpret_cast<const uint4 *>(src);
    uint4 *dst4 = reinterpret_cast<uint4 *>(dst);
    for (unsigned long long i = start; i < bytes / 16; i += step) {
      dst4[i] = src4[i];
    }
  } else {
    for (unsigned long long i = start; i < bytes; i += step) {
      dst[i] = src[i];
    }
  }
}

} // namespace

extern "C" int gf_cuda_copy_batch(const gf_copy *copies, size_t count, void *stream) {
  for (size_t first = 0; first < count; first += GF_CUDA_COPIES_PER_LAUNCH) {
    const size_t chunk = count - first < GF_CUDA_COPIES_PER_LAUNCH
                             ? count - first
                             : static_cast<size_t>(GF_CUDA_COPIES_PER_LAUNCH);
    CopyTable table;
    unsigned long long largest = 0;
    for (size_t i = 0; i < chunk; ++i) {
      table.src[i] = copies[first + i].src;
      table.dst[i] = copies[first + i].dst;
      table.bytes[i] = copies[first + i].bytes;
      largest = table.bytes[i] > largest ? table.bytes[i] : largest;
    }
    const unsigned long long per_block = kThreads * 16ull;
    unsigned long long blocks = (largest + per_block - 1) / per_block;
    blocks = blocks == 0 ? 1 : (blocks > kMaxBlocksPerCopy ? kMaxBlocksPerCopy : blocks);
    dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(chunk));
    gf_copy_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table);
    cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
      return static_cast<int>(error);
    }
  }
  return 0;
}

extern "C" const char *gf_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
