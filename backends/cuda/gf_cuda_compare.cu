// The batched comparison of verify mode (see gf_cuda_compare.h). The pair table travels as a
// kernel parameter: 4 pairs (96 bytes) where that is enough, which a sampled call's outputs
// usually are, else 64 (1.5 KiB, under the 4 KiB every architecture accepts). blockIdx.y
// picks the pair; the blocks along x stride over its bytes in 16-byte vectors when both ends and
// the length allow it, else byte by byte. A block that finds a difference sets scratch[0]; every
// block then counts itself done in scratch[1], and the one that counts last (of every launch of
// the comparison: the launches of one stream run in order) writes the verdict to the host byte
// and zeroes both words for the comparison's next use.
#include "gf_cuda_compare.h"
#include "gf_cuda_compare_jobs.h"
#include "gf_cuda_copy.h"
#include "gf_cuda_differs.cuh"
#include "gf_cuda_stride.cuh"

#include <cuda_runtime.h>

#include <stdint.h>

namespace {

template <int N> struct CompareTable {
  const void *left[N];
  const void *right[N];
  unsigned long long bytes[N];
};

constexpr int kFewPairs = 4;

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocksPerPair = 256;

__device__ bool differs(const char *left, const char *right, unsigned long long bytes) {
  const gf_cuda_stride stride = gf_cuda_stride_of(left, right, bytes, kThreads);
  return gf_cuda_bytes_differ(left, right, 0, bytes, stride.start, stride.step, stride.vectorised);
}

template <int N>
__global__ void gf_compare_kernel(const CompareTable<N> table, unsigned total_blocks,
                                  uint8_t *verdict, uint32_t *scratch) {
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
    __threadfence(); // the scratch is zero before the host can see the verdict and reuse it
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

template <int N>
cudaError_t launch(const gf_copy *pairs, size_t count, unsigned total_blocks, uint8_t *verdict,
                   uint32_t *scratch, cudaStream_t stream) {
  CompareTable<N> table = {};
  for (size_t i = 0; i < count; ++i) {
    table.left[i] = pairs[i].dst;
    table.right[i] = pairs[i].src;
    table.bytes[i] = pairs[i].bytes;
  }
  const dim3 grid(blocks_per_pair(pairs, count), static_cast<unsigned>(count));
  gf_compare_kernel<N><<<grid, kThreads, 0, stream>>>(table, total_blocks, verdict, scratch);
  return cudaGetLastError();
}

// The device's address of a pinned host byte (cudaHostGetDevicePointer's: for torch's pinned
// memory, which cudaHostAlloc made, the host's own under unified addressing), kept per thread for
// the last bytes asked about, since a runner reuses its verdict bytes and the lookup would
// cost each sampled call a driver call.
// A runner's verdict bytes: the 32 of its verify queue, and a few more a caller hands itself.
constexpr unsigned kKnownAddresses = 40;

uint8_t *device_address_of(uint8_t *host) {
  thread_local uint8_t *known_host[kKnownAddresses] = {};
  thread_local uint8_t *known_device[kKnownAddresses] = {};
  thread_local unsigned next = 0;
  for (unsigned i = 0; i < kKnownAddresses; ++i) {
    if (known_host[i] == host) {
      return known_device[i];
    }
  }
  void *device = nullptr;
  if (cudaHostGetDevicePointer(&device, host, 0) != cudaSuccess) {
    cudaGetLastError(); // not pinned, or not mapped: the caller compares another way
    return nullptr;
  }
  known_host[next % kKnownAddresses] = host;
  known_device[next % kKnownAddresses] = static_cast<uint8_t *>(device);
  ++next;
  return static_cast<uint8_t *>(device);
}

} // namespace

extern "C" int gf_cuda_compare_later(const gf_copy *pairs, size_t count, uint8_t *verdict,
                                     uint32_t *scratch, cudaStream_t stream) {
  uint8_t *device_verdict = count == 0 ? nullptr : device_address_of(verdict);
  if (device_verdict == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (gf_cuda_compare_job(pairs, count, device_verdict, scratch, stream)) {
    return 0; // queued as a ready graph: 1.3 us of host time against 3.3 (see its .h)
  }
  unsigned long long total_blocks = 0;
  for (size_t first = 0; first < count; first += GF_CUDA_COMPARES_PER_LAUNCH) {
    const size_t chunk = chunk_at(first, count);
    total_blocks += static_cast<unsigned long long>(blocks_per_pair(pairs + first, chunk)) * chunk;
  }
  const unsigned blocks = static_cast<unsigned>(total_blocks);
  for (size_t first = 0; first < count; first += GF_CUDA_COMPARES_PER_LAUNCH) {
    const size_t chunk = chunk_at(first, count);
    const cudaError_t error =
        chunk <= kFewPairs
            ? launch<kFewPairs>(pairs + first, chunk, blocks, device_verdict, scratch, stream)
            : launch<GF_CUDA_COMPARES_PER_LAUNCH>(pairs + first, chunk, blocks, device_verdict,
                                                  scratch, stream);
    if (error != cudaSuccess) {
      return static_cast<int>(error);
    }
  }
  return 0;
}
