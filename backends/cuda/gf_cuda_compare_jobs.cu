// Verify mode's comparison launched as a ready graph (see gf_cuda_compare_jobs.h). A job holds up
// to 64 pairs, cut into chunks of 8 KiB; a fixed grid of blocks strides over the chunks of every
// pair after loading the job into shared memory, compares 16-byte vectors where both ends and the
// chunk allow it, else bytes, and ends as the batched comparison does (gf_cuda_compare.cu): a block
// that found a difference sets scratch[0], every block counts itself in scratch[1], and the last
// zeroes both, clears the job's in-flight flag and writes the verdict. The host takes a job only
// while that flag is clear, so no queued launch reads another comparison's pairs.
#include "gf_cuda_compare_jobs.h"
#include "gf_cuda_differs.cuh"

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <new>
#include <stdint.h>

namespace {

constexpr int kJobPairs = 64;
constexpr int kJobsPerDevice = 64; // comparisons in flight at once on a device, before kernels
constexpr int kDevicesMost = 64;
constexpr int kThreads = 256;
constexpr unsigned kJobBlocks = 256;
constexpr unsigned long long kChunkBytes = 8192;

struct CompareJob { // in mapped pinned host memory: written by the host, read by the device
  unsigned count;
  unsigned in_flight; // set by the host that takes the job, cleared by its launch's last block
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

// A device's jobs, shared by every runner on it and never freed: a runner's teardown makes no
// CUDA call (cudaFreeHost would wait for the whole device, and at exit the runtime may be gone).
struct DeviceJobs {
  std::mutex lock;              // taking a job, and making the jobs
  bool made = false;            // the jobs were asked for (host_jobs is null where that failed)
  std::atomic<bool> unusable{}; // no pinned jobs, or a graph failed: kernel launches from then on
  CompareJob *host_jobs = nullptr;
  CompareJob *device_jobs = nullptr;            // the same, as the device addresses them
  cudaGraphExec_t exec[kJobsPerDevice][2] = {}; // over kFewBlocks, over kJobBlocks (made lazily)
  // A job's graph being launched: its kernel may free the job before cudaGraphLaunch returns, and
  // CUDA does not allow one graph to be launched from two threads at once.
  std::atomic<bool> launching[kJobsPerDevice] = {};
};

DeviceJobs *jobs_of(int device_index) {
  static DeviceJobs *const all = new (std::nothrow) DeviceJobs[kDevicesMost]; // never freed
  return all != nullptr ? all + device_index : nullptr;
}

// Pinned allocations and graph making are calls CUDA prohibits while another thread captures in
// global mode (torch.cuda.graph's default), and making them would invalidate that capture; this
// thread makes them in relaxed mode, which prohibits nothing.
class RelaxedCaptureMode {
public:
  RelaxedCaptureMode() { exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (exchanged_) {
      cudaThreadExchangeStreamCaptureMode(&mode_);
    }
  }
  RelaxedCaptureMode(const RelaxedCaptureMode &) = delete;
  RelaxedCaptureMode &operator=(const RelaxedCaptureMode &) = delete;

private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

__device__ bool chunk_differs(const char *left, const char *right, unsigned long long from,
                              unsigned long long to) {
  const bool vectorised =
      ((reinterpret_cast<uintptr_t>(left) | reinterpret_cast<uintptr_t>(right) | from | to) &
       15u) == 0;
  return gf_cuda_bytes_differ(left, right, from, to, threadIdx.x, blockDim.x, vectorised);
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
    // The scratch is zero, and every block read the job before it counted itself: the job is
    // free before the verdict is seen, so a comparison queued after the verdict was read finds it
    // free.
    __threadfence_system();
    *reinterpret_cast<volatile unsigned *>(&job->in_flight) = 0;
    __threadfence_system();
    *reinterpret_cast<volatile uint8_t *>(verdict) = found_any != 0 ? 1 : 0;
    __threadfence_system();
  }
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

// Allocates a device's jobs once (its lock held); a failure leaves them unusable.
void make_jobs(DeviceJobs &jobs) {
  jobs.made = true;
  RelaxedCaptureMode relaxed;
  void *device_address = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void **>(&jobs.host_jobs), kJobsPerDevice * sizeof(CompareJob),
                    cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer(&device_address, jobs.host_jobs, 0) != cudaSuccess) {
    cudaGetLastError(); // no mapped pinned memory: the comparisons are launched as kernels
    jobs.unusable = true;
    return; // a block allocated but not mapped is kept: freeing it would wait for the device
  }
  for (int i = 0; i < kJobsPerDevice; ++i) {
    jobs.host_jobs[i].in_flight = 0;
  }
  jobs.device_jobs = static_cast<CompareJob *>(device_address);
}

// Takes the first free job of the device (its in-flight flag set) and its graph over many blocks
// or few (made if new): the job's index, or -1 when every job is in flight or none can be had.
int take_job(DeviceJobs &jobs, int many, cudaGraphExec_t *exec) {
  std::lock_guard<std::mutex> held(jobs.lock);
  if (!jobs.made) {
    make_jobs(jobs);
  }
  for (int i = 0; !jobs.unusable && i < kJobsPerDevice; ++i) {
    volatile unsigned *in_flight = &jobs.host_jobs[i].in_flight;
    if (*in_flight != 0 || jobs.launching[i].load(std::memory_order_acquire)) {
      continue;
    }
    if (jobs.exec[i][many] == nullptr &&
        make_graph(jobs.device_jobs + i, many ? kJobBlocks : kFewBlocks, &jobs.exec[i][many]) !=
            cudaSuccess) {
      cudaGetLastError();
      jobs.unusable = true; // kernel launches from now on
      return -1;
    }
    *in_flight = 1;
    jobs.launching[i].store(true, std::memory_order_relaxed);
    *exec = jobs.exec[i][many];
    return i;
  }
  return -1;
}

// gf_cuda_compare_job, which catches what the lock may throw.
int queue_job(const gf_copy *pairs, size_t count, uint8_t *verdict_device, uint32_t *scratch,
              cudaStream_t stream) {
  if (count == 0 || count > static_cast<size_t>(kJobPairs)) {
    return 0;
  }
  int device_index = -1;
  int stream_device = -1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaGetDevice(&device_index) != cudaSuccess ||
      cudaStreamGetDevice(stream, &stream_device) != cudaSuccess ||
      cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError(); // the kernel launch reports what the device holds
    return 0;
  }
  if (device_index < 0 || device_index >= kDevicesMost || stream_device != device_index ||
      capture != cudaStreamCaptureStatusNone) {
    return 0; // a stream of another device than the current one, or captured: a kernel launch
  }
  DeviceJobs *jobs = jobs_of(device_index);
  unsigned long long chunks = 0;
  for (size_t i = 0; i < count; ++i) {
    chunks += (pairs[i].bytes + kChunkBytes - 1) / kChunkBytes;
  }
  cudaGraphExec_t exec = nullptr;
  const int index = jobs == nullptr || jobs->unusable
                        ? -1
                        : take_job(*jobs, chunks * kChunkBytes > kFewBlocksBytes, &exec);
  if (index < 0) {
    return 0;
  }
  CompareJob *job = jobs->host_jobs + index; // this thread's alone until its launch frees it
  chunks = 0;
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
  std::atomic_thread_fence(std::memory_order_seq_cst); // the job is written before the launch
  const bool launched = cudaGraphLaunch(exec, stream) == cudaSuccess;
  if (!launched) {
    // Nothing was queued: the error is cleared and the comparison launched as a kernel, which
    // reports an error the device holds; no graph is tried again on this device.
    jobs->unusable = true;
    cudaGetLastError();
    *reinterpret_cast<volatile unsigned *>(&job->in_flight) = 0;
  }
  jobs->launching[index].store(false, std::memory_order_release);
  return launched ? 1 : 0;
}

} // namespace

extern "C" int gf_cuda_compare_job(const gf_copy *pairs, size_t count, uint8_t *verdict_device,
                                   uint32_t *scratch, cudaStream_t stream) {
  try {
    return queue_job(pairs, count, verdict_device, scratch, stream);
  } catch (...) { // std::mutex::lock's system_error: launched as a kernel
    return 0;
  }
}
