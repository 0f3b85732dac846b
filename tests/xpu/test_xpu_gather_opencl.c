/* Runs the XPU backend's gather kernel, as the build produced it (SPIR-V), on a CPU OpenCL
 * runtime, since no Intel GPU is at hand: aligned, unaligned and empty copies from one table, the
 * launch shape the backend uses (gf_xpu_level_zero.h). It uses the first device that takes
 * SPIR-V (CL_DEVICE_IL_VERSION; Intel's CPU runtime from PyPI does). A device without IL support
 * (pocl 3.1) would only prove the OpenCL C source, so it is a skip (exit 77) unless
 * GF_TEST_OPENCL_SOURCE_FALLBACK=1 asks for the source run.
 * Usage: test_xpu_gather_opencl KERNEL.spv KERNEL.cl */
#define CL_TARGET_OPENCL_VERSION 210
#include <CL/cl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GROUP_SIZE = 256, GROUPS_PER_COPY = 16, BYTES = 1 << 16 };

static unsigned char *read_file(const char *path, size_t *size) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return NULL;
  }
  fseek(file, 0, SEEK_END);
  long length = ftell(file);
  fseek(file, 0, SEEK_SET);
  unsigned char *bytes = malloc((size_t)length + 1);
  if (bytes != NULL && fread(bytes, 1, (size_t)length, file) == (size_t)length) {
    bytes[length] = 0;
    *size = (size_t)length;
  } else {
    free(bytes);
    bytes = NULL;
  }
  fclose(file);
  return bytes;
}

#define CL_CHECK(call)                                                                             \
  do {                                                                                             \
    cl_int check_error = (call);                                                                   \
    if (check_error != CL_SUCCESS) {                                                               \
      fprintf(stderr, "%s failed: %d\n", #call, check_error);                                      \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s KERNEL.spv KERNEL.cl\n", argv[0]);
    return 2;
  }
  cl_platform_id platforms[8];
  cl_uint platform_count = 0;
  if (clGetPlatformIDs(8, platforms, &platform_count) != CL_SUCCESS || platform_count == 0) {
    printf("skipped: no OpenCL platform\n");
    return 77;
  }
  cl_device_id device = NULL;
  cl_device_id fallback = NULL;
  for (cl_uint p = 0; p < platform_count && device == NULL; ++p) {
    cl_device_id found = NULL;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 1, &found, NULL) != CL_SUCCESS) {
      continue;
    }
    char il[256] = "";
    clGetDeviceInfo(found, CL_DEVICE_IL_VERSION, sizeof il, il, NULL);
    if (strstr(il, "SPIR-V") != NULL) {
      device = found;
    } else if (fallback == NULL) {
      fallback = found;
    }
  }
  int from_source = device == NULL;
  if (from_source) {
    const char *allowed = getenv("GF_TEST_OPENCL_SOURCE_FALLBACK");
    if (fallback == NULL || allowed == NULL || strcmp(allowed, "1") != 0) {
      printf("skipped: no OpenCL device takes SPIR-V (install intel-opencl-rt)\n");
      return 77;
    }
    device = fallback;
  }
  char name[256] = "";
  clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
  printf("device: %s (%s)\n", name, from_source ? "OpenCL C source" : "SPIR-V");

  cl_int error = CL_SUCCESS;
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &error);
  CL_CHECK(error);
  cl_command_queue queue = clCreateCommandQueueWithProperties(context, device, NULL, &error);
  CL_CHECK(error);
  size_t size = 0;
  unsigned char *code = read_file(argv[from_source ? 2 : 1], &size);
  if (code == NULL || size == 0) {
    fprintf(stderr, "cannot read %s\n", argv[from_source ? 2 : 1]);
    return 1;
  }
  cl_program program =
      from_source ? clCreateProgramWithSource(context, 1, (const char **)&code, &size, &error)
                  : clCreateProgramWithIL(context, code, size, &error);
  CL_CHECK(error);
  if (clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
    char log[4096] = "";
    clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    fprintf(stderr, "build failed: %s\n", log);
    return 1;
  }
  cl_kernel kernel = clCreateKernel(program, "gf_xpu_gather", &error);
  CL_CHECK(error);

  /* One buffer holds sources and destinations; the table holds device addresses, so the test
   * uses shared virtual memory (the kernel reads raw pointers, as on Level Zero). */
  unsigned char *memory = clSVMAlloc(context, CL_MEM_READ_WRITE, 2 * BYTES, 64);
  uint64_t *table = clSVMAlloc(context, CL_MEM_READ_WRITE, 3 * 8 * sizeof(uint64_t), 64);
  if (memory == NULL || table == NULL) {
    printf("skipped: the device has no fine-grained SVM for raw pointers\n");
    return 77;
  }
  CL_CHECK(clEnqueueSVMMap(queue, CL_TRUE, CL_MAP_WRITE, memory, 2 * BYTES, 0, NULL, NULL));
  CL_CHECK(clEnqueueSVMMap(queue, CL_TRUE, CL_MAP_WRITE, table, 24 * 8, 0, NULL, NULL));
  for (int i = 0; i < BYTES; ++i) {
    memory[i] = (unsigned char)(i * 13 + 5);
  }
  memset(memory + BYTES, 0, BYTES);
  /* (src offset, dst offset, bytes): aligned large, unaligned, empty, aligned small. */
  const size_t cases[4][3] = {
      {0, 0, 40000}, {40001, 40003, 777}, {41000, 41000, 0}, {48000, 48000, 4096}};
  for (int i = 0; i < 4; ++i) {
    table[3 * i] = (uint64_t)(uintptr_t)(memory + cases[i][0]);
    table[3 * i + 1] = (uint64_t)(uintptr_t)(memory + BYTES + cases[i][1]);
    table[3 * i + 2] = cases[i][2];
  }
  CL_CHECK(clEnqueueSVMUnmap(queue, memory, 0, NULL, NULL));
  CL_CHECK(clEnqueueSVMUnmap(queue, table, 0, NULL, NULL));
  cl_uint count = 4;
  CL_CHECK(clSetKernelArgSVMPointer(kernel, 0, table));
  CL_CHECK(clSetKernelArg(kernel, 1, sizeof count, &count));
  void *used[1] = {memory};
  CL_CHECK(clSetKernelExecInfo(kernel, CL_KERNEL_EXEC_INFO_SVM_PTRS, sizeof used, used));
  size_t global[2] = {GROUPS_PER_COPY * GROUP_SIZE, count};
  size_t local[2] = {GROUP_SIZE, 1};
  CL_CHECK(clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, local, 0, NULL, NULL));
  CL_CHECK(clFinish(queue));
  CL_CHECK(clEnqueueSVMMap(queue, CL_TRUE, CL_MAP_READ, memory, 2 * BYTES, 0, NULL, NULL));
  int failures = 0;
  size_t copied = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned char *src = memory + cases[i][0];
    const unsigned char *dst = memory + BYTES + cases[i][1];
    if (memcmp(src, dst, cases[i][2]) != 0) {
      fprintf(stderr, "copy %d (%zu bytes) differs\n", i, cases[i][2]);
      failures += 1;
    }
    copied += cases[i][2];
  }
  /* Nothing written outside the copies: count the destination's non-zero bytes. */
  size_t written = 0;
  for (int i = 0; i < BYTES; ++i) {
    written += memory[BYTES + i] != 0;
  }
  size_t zero_in_sources = 0;
  for (int i = 0; i < 4; ++i) {
    for (size_t j = 0; j < cases[i][2]; ++j) {
      zero_in_sources += memory[cases[i][0] + j] == 0;
    }
  }
  if (written != copied - zero_in_sources) {
    fprintf(stderr, "%zu bytes written, %zu expected\n", written, copied - zero_in_sources);
    failures += 1;
  }
  CL_CHECK(clEnqueueSVMUnmap(queue, memory, 0, NULL, NULL));
  CL_CHECK(clFinish(queue));
  clSVMFree(context, memory);
  clSVMFree(context, table);
  clReleaseKernel(kernel);
  clReleaseProgram(program);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
  free(code);
  printf("aligned, unaligned and empty copies: %s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
