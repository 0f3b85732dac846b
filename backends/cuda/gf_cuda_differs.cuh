// Whether two ranges of device bytes differ, as one thread of a comparison kernel sees them: the
// batched comparison (gf_cuda_compare.cu) and the comparison job (gf_cuda_compare_jobs.cu) both
// walk [from, to) of a pair this way, in 16-byte vectors when both ends and the range allow it,
// else byte by byte, each from its own first index and step.
#ifndef GF_CUDA_DIFFERS_CUH
#define GF_CUDA_DIFFERS_CUH

#include <stdint.h>

// True when this thread's indices of [from, to) hold a difference: indices start, start + step,
// ... counting uint4 vectors from `from` where `vectorised`, else bytes.
__device__ inline bool gf_cuda_bytes_differ(const char *left, const char *right,
                                            unsigned long long from, unsigned long long to,
                                            unsigned long long start, unsigned long long step,
                                            bool vectorised) {
  if (vectorised) {
    const uint4 *left4 = reinterpret_cast<const uint4 *>(left + from);
    const uint4 *right4 = reinterpret_cast<const uint4 *>(right + from);
    for (unsigned long long i = start; i < (to - from) / 16; i += step) {
      const uint4 a = left4[i];
      const uint4 b = right4[i];
      if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
        return true;
      }
    }
    return false;
  }
  for (unsigned long long i = from + start; i < to; i += step) {
    if (left[i] != right[i]) {
      return true;
    }
  }
  return false;
}

#endif // GF_CUDA_DIFFERS_CUH
