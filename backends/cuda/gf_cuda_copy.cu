// The batched copy kernel (see gf_cuda_copy.h). The copy table travels as a kernel parameter
// (16 to 128 entries: 384 bytes to 3 KiB, under the 4 KiB every architecture accepts), so a launch
// needs no host-to-device upload of its own, and a graph node's table is rewritten with
// cudaGraphExecKernelNodeSetParams. blockIdx.y picks the copy; the blocks along x stride over its
// bytes in 16-byte vectors when both ends and the length allow it, else byte by byte. A zero-byte
// entry copies nothing. The role only makes the input node, the output node and plain launches
// distinct functions, so a captured graph's nodes can be told apart.
#include "gf_cuda_copy.h"
#include "gf_cuda_stride.cuh"

#include <cuda_runtime.h>

#include <new>
#include <stdint.h>

namespace {

template <int N> struct CopyTable {
  const void *src[N];
  void *dst[N];
  unsigned long long bytes[N];
};

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocksPerCopy = 1024;
constexpr int kSmallTable = 16;
constexpr int kPlainLaunch = 2; // the role of copies launched outside a graph

template <int N, int Role> __global__ void gf_copy_kernel(const CopyTable<N> table) {
  const unsigned copy = blockIdx.y;
  const unsigned long long bytes = table.bytes[copy];
  const char *src = static_cast<const char *>(table.src[copy]);
  char *dst = static_cast<char *>(table.dst[copy]);
  const gf_cuda_stride stride = gf_cuda_stride_of(src, dst, bytes, kThreads);
  if (stride.vectorised) {
    const uint4 *src4 = reinterpret_cast<const uint4 *>(src);
    uint4 *dst4 = reinterpret_cast<uint4 *>(dst);
    for (unsigned long long i = stride.start; i < bytes / 16; i += stride.step) {
      dst4[i] = src4[i];
    }
  } else {
    for (unsigned long long i = stride.start; i < bytes; i += stride.step) {
      dst[i] = src[i];
    }
  }
}

template <int N> void fill_table(CopyTable<N> &table, const gf_copy *copies, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    table.src[i] = copies[i].src;
    table.dst[i] = copies[i].dst;
    table.bytes[i] = copies[i].bytes;
  }
}

dim3 grid_for(const gf_copy *copies, size_t count) {
  return dim3(gf_cuda_blocks_per_range(copies, count, kMaxBlocksPerCopy),
              static_cast<unsigned>(count));
}

template <int N, int Role> int launch(const gf_copy *copies, size_t count, cudaStream_t stream) {
  CopyTable<N> table;
  fill_table(table, copies, count);
  gf_copy_kernel<N, Role><<<grid_for(copies, count), kThreads, 0, stream>>>(table);
  return static_cast<int>(cudaGetLastError());
}

// Tables of 16, 32, 64 or 128 entries: the smallest that fits, since the table is copied into
// every launch and every node rewrite.
constexpr int kTableSizes[] = {kSmallTable, 32, 64, GF_CUDA_COPIES_PER_LAUNCH};

int table_size_for(size_t count) {
  for (int size : kTableSizes) {
    if (count <= static_cast<size_t>(size)) {
      return size;
    }
  }
  return GF_CUDA_COPIES_PER_LAUNCH;
}

template <int Role> int launch_sized(const gf_copy *copies, size_t count, cudaStream_t stream) {
  switch (table_size_for(count)) {
  case kSmallTable:
    return launch<kSmallTable, Role>(copies, count, stream);
  case 32:
    return launch<32, Role>(copies, count, stream);
  case 64:
    return launch<64, Role>(copies, count, stream);
  default:
    return launch<GF_CUDA_COPIES_PER_LAUNCH, Role>(copies, count, stream);
  }
}

template <int Role> const void *kernel_for_size(int table_size) {
  switch (table_size) {
  case kSmallTable:
    return reinterpret_cast<const void *>(gf_copy_kernel<kSmallTable, Role>);
  case 32:
    return reinterpret_cast<const void *>(gf_copy_kernel<32, Role>);
  case 64:
    return reinterpret_cast<const void *>(gf_copy_kernel<64, Role>);
  default:
    return reinterpret_cast<const void *>(gf_copy_kernel<GF_CUDA_COPIES_PER_LAUNCH, Role>);
  }
}

const void *kernel_of(int role, int table_size) {
  return role == GF_COPY_INPUTS ? kernel_for_size<GF_COPY_INPUTS>(table_size)
                                : kernel_for_size<GF_COPY_OUTPUTS>(table_size);
}

template <int N>
int update(cudaGraphExec_t exec, const gf_cuda_copy_node *node, const void *kernel,
           const gf_copy *copies, size_t count) {
  CopyTable<N> table;
  fill_table(table, copies, count);
  void *arguments[] = {&table};
  cudaKernelNodeParams params = {};
  params.func = const_cast<void *>(kernel);
  params.gridDim = dim3(node->grid_x, node->grid_y);
  params.blockDim = dim3(kThreads);
  params.sharedMemBytes = 0;
  params.kernelParams = arguments;
  params.extra = nullptr;
  return static_cast<int>(
      cudaGraphExecKernelNodeSetParams(exec, static_cast<cudaGraphNode_t>(node->node), &params));
}

} // namespace

extern "C" unsigned gf_cuda_blocks_per_range(const gf_copy *ranges, size_t count,
                                             unsigned max_blocks) {
  unsigned long long largest = 0;
  for (size_t i = 0; i < count; ++i) {
    largest = ranges[i].bytes > largest ? ranges[i].bytes : largest;
  }
  const unsigned long long per_block = kThreads * 16ull;
  unsigned long long blocks = (largest + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

extern "C" int gf_cuda_copy_batch(const gf_copy *copies, size_t count, cudaStream_t stream) {
  for (size_t first = 0; first < count; first += GF_CUDA_COPIES_PER_LAUNCH) {
    const size_t chunk = count - first < GF_CUDA_COPIES_PER_LAUNCH
                             ? count - first
                             : static_cast<size_t>(GF_CUDA_COPIES_PER_LAUNCH);
    int error = launch_sized<kPlainLaunch>(copies + first, chunk, stream);
    if (error != 0) {
      return error;
    }
  }
  return 0;
}

extern "C" int gf_cuda_copy_record(int role, const gf_copy *copies, size_t count,
                                   cudaStream_t stream) {
  if (count == 0 || count > GF_CUDA_COPIES_PER_LAUNCH) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return role == GF_COPY_INPUTS ? launch_sized<GF_COPY_INPUTS>(copies, count, stream)
                                : launch_sized<GF_COPY_OUTPUTS>(copies, count, stream);
}

extern "C" int gf_cuda_copy_find_node(cudaGraph_t raw, int role, gf_cuda_copy_node *found) {
  size_t count = 0;
  cudaError_t error = cudaGraphGetNodes(raw, nullptr, &count);
  if (error != cudaSuccess) {
    return -static_cast<int>(error);
  }
  cudaGraphNode_t *nodes = new (std::nothrow) cudaGraphNode_t[count ? count : 1];
  if (nodes == nullptr) {
    return -static_cast<int>(cudaErrorMemoryAllocation);
  }
  error = cudaGraphGetNodes(raw, nodes, &count);
  int result = error == cudaSuccess ? 0 : -static_cast<int>(error);
  for (size_t i = 0; result == 0 && i < count; ++i) {
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) {
      continue;
    }
    cudaKernelNodeParams params = {};
    if (cudaGraphKernelNodeGetParams(nodes[i], &params) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    for (int table_size : kTableSizes) {
      if (params.func == kernel_of(role, table_size)) {
        *found = gf_cuda_copy_node{nodes[i], params.func, table_size, params.gridDim.x,
                                   params.gridDim.y};
        result = 1;
        break;
      }
    }
  }
  delete[] nodes;
  return result;
}

extern "C" int gf_cuda_copy_update(cudaGraphExec_t raw, const gf_cuda_copy_node *node,
                                   const gf_copy *copies, size_t count) {
  if (count != node->grid_y) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  switch (node->table_size) {
  case kSmallTable:
    return update<kSmallTable>(raw, node, node->kernel, copies, count);
  case 32:
    return update<32>(raw, node, node->kernel, copies, count);
  case 64:
    return update<64>(raw, node, node->kernel, copies, count);
  default:
    return update<GF_CUDA_COPIES_PER_LAUNCH>(raw, node, node->kernel, copies, count);
  }
}

extern "C" const char *gf_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
