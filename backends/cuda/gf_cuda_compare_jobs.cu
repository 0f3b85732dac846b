// Verify mode's comparison launched as a ready graph (see gf_cuda_compare_jobs.h). A job holds up
// to 64 pairs, cut into chunks of 8 KiB; a fixed grid of blocks strides over the chunks of every
// pair after loading the job into shared memory, compares 16-byte vectors where both ends and the
// chunk allow it, else bytes, and ends as the batched comparison does (gf_cuda_compare.cu): a block
// that found a difference sets scratch[0], every block counts itself in scratch[1], and the last
// zeroes both, clears the job's in-flight flag and writes the verdict. The host rewrites a job
// only while that flag is clear (else it launches a kernel), so no queued launch reads another's.
#include "gf_cuda_compare_jobs.h"

#include <cuda_runtime.h>

#include <atomic>
#include <new>
#include <stdint.h>

namespace {

constexpr int kJobPairs = 64;
constexpr int kJobSlots = 48; // verdict bytes a runner may use: its queue's 32, Python's few
constexpr int kThreads = 256;
constexpr unsigned kJobBlocks = 256;
constexpr unsigned long long kChunkBytes = 8192;

struct CompareJob { // in mapped pinned host memory: written by the host, read by the device
  unsigned count;
  unsigned in_flight; // set by the host before a launch, cleared by its last block
  unsigned long long chunks;
  unsigned long long first_chunk[kJobPairs];
  const char *left[kJobPairs];
  const char *right[kJobPairs];
  unsigned long long bytes[kJobPairs];
  uint8_t *verdict;
  uint32_t *scratch;
};

// A job's graphs: its kernel over few blocks, for outputs the device reads in a few
// microseconds (each block first reads the job across the bus), and over many, for the rest.
constexpr unsigned kFewBlocks = 4;
constexpr unsigned long long kFewBlocksBytes = 256 * 1024;

struct JobSlot {
  uint8_t *verdict_host;
  cudaGraphExec_t exec[2]; // over kFewBlocks, over kJobBlocks (made when first needed)
};

// Pinned allocations, frees and graph making are calls CUDA prohibits while another thread
// captures in global mode (the default of torch.cuda.graph), and making them would invalidate
// that capture; this thread makes them in relaxed mode, which prohibits nothing.
class RelaxedCaptureMode {
public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode &) = delete;
  RelaxedCaptureMode &operator=(const RelaxedCaptureMode &) = delete;

private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

} // namespace

struct gf_cuda_compare_jobs {
  int device_index;        // the device its graphs were made on
  int used;                // slots made
  bool unusable;           // no pinned jobs, or a graph failed: kernel launches from then on
  CompareJob *host_jobs;   // kJobSlots jobs
  CompareJob *device_jobs; // the same, as the device addresses them
  JobSlot slots[kJobSlots];
};

namespace {

__device__ bool chunk_differs(const char *left, const char *right, unsigned long long from,
                              unsigned long long to) {
  const bool vectorised =
      ((reinterpret_cast<uintptr_t>(left) | reinterpret_cast<uintptr_t>(right) | from | to) &
       15u) == 0;
  if (vectorised) {
    const uint4 *left4 = reinterpret_cast<const uint4 *>(left + from);
    const uint4 *right4 = reinterpret_cast<const uint4 *>(right + from);
    for (unsigned long long i = threadIdx.x; i < (to - from) / 16; i += blockDim.x) {
      const uint4 a = left4[i];
      const uint4 b = right4[i];
      if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
        return true;
      }
    }
    return false;
  }
  for (unsigned long long i = from + threadIdx.x; i < to; i += blockDim.x) {
    if (left[i] != right[i]) {
      return true;
    }
  }
  return false;
}

__global__ void gf_compare_job_kernel(CompareJob *job) {
  __shared__ unsigned count;
  __shared__ unsigned long long chunks;
  __shared__ unsigned long long first_chunk[kJobPairs];
  __shared__ const char *left[kJobPairs];
  __shared__ const char *right[kJobPairs];
  __shared__ unsigned long long bytes[kJobPairs];
  __shared__ uint32_t *scratch;
  __shared__ uint8_t *verdict;
  if (threadIdx.x == 0) {
    count = job->count;
    chunks = job->chunks;
    scratch = job->scratch;
    verdict = job->verdict;
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) {
    first_chunk[i] = job->first_chunk[i];
    left[i] = job->left[i];
    right[i] = job->right[i];
    bytes[i] = job->bytes[i];
  }
  __syncthreads();
  bool found = false;
  for (unsigned long long chunk = blockIdx.x; chunk < chunks && !found; chunk += gridDim.x) {
    unsigned pair = 0;
    while (pair + 1 < count && first_chunk[pair + 1] <= chunk) {
      ++pair;
    }
    const unsigned long long from = (chunk - first_chunk[pair]) * kChunkBytes;
    const unsigned long long end = from + kChunkBytes;
    found = chunk_differs(left[pair], right[pair], from, end < bytes[pair] ? end : bytes[pair]);
  }
  const int block_found = __syncthreads_or(found);
  if (threadIdx.x != 0) {
    return;
  }
  if (block_found) {
    atomicOr(&scratch[0], 1u);
  }
  __threadfence(); // this block's finding is seen before its count
  if (atomicAdd(&scratch[1], 1u) + 1 == gridDim.x) {
    const uint32_t found_any = atomicExch(&scratch[0], 0u);
    atomicExch(&scratch[1], 0u);
    __threadfence(); // the scratch is zero before the host can see the verdict and reuse it
    // Every block read the job before it counted itself: the job is free before the verdict is
    // seen, so a verdict byte handed again once written finds its job free.
    *reinterpret_cast<volatile unsigned *>(&job->in_flight) = 0;
    __threadfence_system();
    *reinterpret_cast<volatile uint8_t *>(verdict) = found_any != 0 ? 1 : 0;
    __threadfence_system();
  }
}

// A runner's jobs on `device_index`; marked unusable when no mapped pinned memory could be had,
// so that later comparisons launch kernels without trying again. NULL only without host memory.
gf_cuda_compare_jobs *make_jobs(int device_index) {
  gf_cuda_compare_jobs *jobs = new (std::nothrow) gf_cuda_compare_jobs{};
  if (jobs == nullptr) {
    return nullptr;
  }
  jobs->device_index = device_index;
  RelaxedCaptureMode relaxed;
  void *device_address = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void **>(&jobs->host_jobs), kJobSlots * sizeof(CompareJob),
                    cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer(&device_address, jobs->host_jobs, 0) != cudaSuccess) {
    cudaGetLastError(); // no mapped pinned memory: the comparison is launched as a kernel
    if (jobs->host_jobs != nullptr) {
      cudaFreeHost(jobs->host_jobs);
      jobs->host_jobs = nullptr;
    }
    jobs->unusable = true;
    return jobs;
  }
  for (int i = 0; i < kJobSlots; ++i)
    jobs->host_jobs[i].in_flight = 0;
  jobs->device_jobs = static_cast<CompareJob *>(device_address);
  return jobs;
}

// The graph of one job: its kernel, over the fixed grid, reading the job at its device address.
cudaError_t make_graph(CompareJob *device_job, unsigned blocks, cudaGraphExec_t *exec) {
  RelaxedCaptureMode relaxed;
  cudaGraph_t graph = nullptr;
  cudaError_t error = cudaGraphCreate(&graph, 0);
  if (error != cudaSuccess) {
    return error;
  }
  void *arguments[] = {&device_job};
  cudaKernelNodeParams params = {};
  params.func = reinterpret_cast<void *>(gf_compare_job_kernel);
  params.gridDim = dim3(blocks);
  params.blockDim = dim3(kThreads);
  params.kernelParams = arguments;
  cudaGraphNode_t node = nullptr;
  error = cudaGraphAddKernelNode(&node, graph, nullptr, 0, &params);
  if (error == cudaSuccess) {
    error = cudaGraphInstantiate(exec, graph, 0);
  }
  if (error != cudaSuccess) {
    *exec = nullptr;
  }
  cudaGraphDestroy(graph);
  return error;
}

// The slot of `verdict_host`, made if new: its index, or -1 when there is no room.
int slot_of(gf_cuda_compare_jobs *jobs, uint8_t *verdict_host) {
  for (int i = 0; i < jobs->used; ++i) {
    if (jobs->slots[i].verdict_host == verdict_host) {
      return i;
    }
  }
  if (jobs->used == kJobSlots) {
    return -1;
  }
  jobs->slots[jobs->used] = JobSlot{verdict_host, {nullptr, nullptr}};
  return jobs->used++;
}

} // namespace

extern "C" int gf_cuda_compare_job(gf_cuda_compare_jobs **jobs, const gf_copy *pairs, size_t count,
                                   uint8_t *verdict_host, uint8_t *verdict_device,
                                   uint32_t *scratch, cudaStream_t stream) {
  int device_index = -1;
  if (count == 0 || count > static_cast<size_t>(kJobPairs) ||
      cudaGetDevice(&device_index) != cudaSuccess) {
    return 0;
  }
  if (*jobs == nullptr) {
    *jobs = make_jobs(device_index);
  }
  if (*jobs == nullptr || (*jobs)->unusable || (*jobs)->device_index != device_index) {
    return 0;
  }
  const int slot = slot_of(*jobs, verdict_host);
  if (slot < 0) {
    return 0;
  }
  CompareJob *job = (*jobs)->host_jobs + slot;
  if (*reinterpret_cast<volatile unsigned *>(&job->in_flight) != 0) {
    return 0; // its last launch has not read it all yet: this comparison is launched as a kernel
  }
  unsigned long long chunks = 0;
  for (size_t i = 0; i < count; ++i) {
    job->first_chunk[i] = chunks;
    job->left[i] = static_cast<const char *>(pairs[i].dst);
    job->right[i] = static_cast<const char *>(pairs[i].src);
    job->bytes[i] = pairs[i].bytes;
    chunks += (pairs[i].bytes + kChunkBytes - 1) / kChunkBytes;
  }
  job->count = static_cast<unsigned>(count);
  job->chunks = chunks;
  job->verdict = verdict_device;
  job->scratch = scratch;
  const int many = chunks * kChunkBytes > kFewBlocksBytes;
  cudaGraphExec_t *exec = &(*jobs)->slots[slot].exec[many];
  cudaError_t error = cudaSuccess;
  if (*exec == nullptr) {
    error = make_graph((*jobs)->device_jobs + slot, many ? kJobBlocks : kFewBlocks, exec);
  }
  if (error == cudaSuccess) {
    *reinterpret_cast<volatile unsigned *>(&job->in_flight) = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst); // the job is written before the launch
    error = cudaGraphLaunch(*exec, stream);
  }
  if (error != cudaSuccess) {
    // Nothing was queued: the error is cleared and the comparison launched as a kernel, which
    // reports an error the device holds; no graph is tried again.
    job->in_flight = 0;
    cudaGetLastError();
    (*jobs)->unusable = true;
    return 0;
  }
  return 1;
}

extern "C" void gf_cuda_compare_jobs_free(gf_cuda_compare_jobs *jobs) {
  if (jobs == nullptr) {
    return;
  }
  bool running = false; // a launch the device has not finished (it failed there, or still runs)
  for (int i = 0; jobs->host_jobs != nullptr && i < jobs->used; ++i) {
    running = running || *reinterpret_cast<volatile unsigned *>(&jobs->host_jobs[i].in_flight) != 0;
  }
  if (!running) { // else the jobs and graphs are kept: the device may read them still
    RelaxedCaptureMode relaxed;
    for (int i = 0; i < jobs->used; ++i) {
      for (cudaGraphExec_t exec : jobs->slots[i].exec) {
        if (exec != nullptr) {
          cudaGraphExecDestroy(exec);
        }
      }
    }
    if (jobs->host_jobs != nullptr) {
      cudaFreeHost(jobs->host_jobs);
    }
    cudaGetLastError(); // at exit the runtime may be gone: nothing to report to
  }
  delete jobs;
}
