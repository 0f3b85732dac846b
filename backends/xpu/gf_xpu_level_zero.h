/* The Level Zero half of the XPU backend, in C: the loader opened at run time (never linked, so a
 * machine without it still loads graphed), driver and device discovery with the checks the
 * backend needs, handle translation for extension calls when the loader wraps handles, and the
 * gather-copy kernel (SPIR-V the build produces and embeds) with its table encoding and launch
 * shape. Everything here is reachable without torch, so it is tested through the real loader with
 * a test driver (tests/xpu, which also holds the Level Zero submission the tests drive the kernel
 * with); the torch half (gf_xpu_torch.cpp) submits through SYCL on torch's own context and
 * device. Every handle created here has one function that releases it. */
#ifndef GF_XPU_LEVEL_ZERO_H
#define GF_XPU_LEVEL_ZERO_H

#include "gf_backend.h"
#include "gf_status.h"
#include "gf_xpu_graph_ext.h"

#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  GF_XPU_MAX_DEVICES = 64,
  /* The lowest driver API the backend is written against (ze_api.h 1.3: module, kernel,
   * immediate list and event calls as used here, and extension lookup by name). */
  GF_XPU_MIN_API_VERSION = ZE_MAKE_VERSION(1, 3),
  /* Gather launch shape (gf_xpu_gather_launch_of, gf_xpu_gather.cl). */
  GF_XPU_GATHER_GROUP_SIZE = 256,
  GF_XPU_GATHER_GROUPS_PER_COPY = 16,
  /* Entries per table half: the input node's and the output node's tables hold this many each. */
  GF_XPU_COPIES_PER_NODE = 128
};

/* The loader's entry points this backend calls, found with dlsym. */
typedef struct gf_xpu_ze_api {
  ze_result_t (*Init)(ze_init_flags_t);
  ze_result_t (*DriverGet)(uint32_t *, ze_driver_handle_t *);
  ze_result_t (*DriverGetApiVersion)(ze_driver_handle_t, ze_api_version_t *);
  ze_result_t (*DriverGetExtensionProperties)(ze_driver_handle_t, uint32_t *,
                                              ze_driver_extension_properties_t *);
  ze_result_t (*DriverGetExtensionFunctionAddress)(ze_driver_handle_t, const char *, void **);
  ze_result_t (*DeviceGet)(ze_driver_handle_t, uint32_t *, ze_device_handle_t *);
  ze_result_t (*DeviceGetProperties)(ze_device_handle_t, ze_device_properties_t *);
  ze_result_t (*DeviceGetModuleProperties)(ze_device_handle_t, ze_device_module_properties_t *);
  ze_result_t (*DeviceGetCommandQueueGroupProperties)(ze_device_handle_t, uint32_t *,
                                                      ze_command_queue_group_properties_t *);
  ze_result_t (*ContextCreate)(ze_driver_handle_t, const ze_context_desc_t *,
                               ze_context_handle_t *);
  ze_result_t (*ContextDestroy)(ze_context_handle_t);
  ze_result_t (*MemAllocDevice)(ze_context_handle_t, const ze_device_mem_alloc_desc_t *, size_t,
                                size_t, ze_device_handle_t, void **);
  ze_result_t (*MemAllocHost)(ze_context_handle_t, const ze_host_mem_alloc_desc_t *, size_t, size_t,
                              void **);
  ze_result_t (*MemFree)(ze_context_handle_t, void *);
  ze_result_t (*ModuleCreate)(ze_context_handle_t, ze_device_handle_t, const ze_module_desc_t *,
                              ze_module_handle_t *, ze_module_build_log_handle_t *);
  ze_result_t (*ModuleDestroy)(ze_module_handle_t);
  ze_result_t (*KernelCreate)(ze_module_handle_t, const ze_kernel_desc_t *, ze_kernel_handle_t *);
  ze_result_t (*KernelDestroy)(ze_kernel_handle_t);
  ze_result_t (*KernelSetGroupSize)(ze_kernel_handle_t, uint32_t, uint32_t, uint32_t);
  ze_result_t (*KernelSetArgumentValue)(ze_kernel_handle_t, uint32_t, size_t, const void *);
  ze_result_t (*CommandListCreateImmediate)(ze_context_handle_t, ze_device_handle_t,
                                            const ze_command_queue_desc_t *,
                                            ze_command_list_handle_t *);
  ze_result_t (*CommandListDestroy)(ze_command_list_handle_t);
  ze_result_t (*CommandListAppendMemoryCopy)(ze_command_list_handle_t, void *, const void *, size_t,
                                             ze_event_handle_t, uint32_t, ze_event_handle_t *);
  ze_result_t (*CommandListAppendLaunchKernel)(ze_command_list_handle_t, ze_kernel_handle_t,
                                               const ze_group_count_t *, ze_event_handle_t,
                                               uint32_t, ze_event_handle_t *);
  ze_result_t (*EventPoolCreate)(ze_context_handle_t, const ze_event_pool_desc_t *, uint32_t,
                                 ze_device_handle_t *, ze_event_pool_handle_t *);
  ze_result_t (*EventPoolDestroy)(ze_event_pool_handle_t);
  ze_result_t (*EventCreate)(ze_event_pool_handle_t, const ze_event_desc_t *, ze_event_handle_t *);
  ze_result_t (*EventDestroy)(ze_event_handle_t);
  ze_result_t (*EventHostSynchronize)(ze_event_handle_t, uint64_t);
  ze_result_t (*EventHostReset)(ze_event_handle_t);
  /* Optional (loaders before 1.8 lack it): NULL means handles are never wrapped. */
  ze_result_t (*LoaderTranslateHandle)(zel_handle_type_t, void *, void **);
} gf_xpu_ze_api;

/* The Level Zero view of the machine: the loader, the first driver with GPU devices, its
 * devices and what they report. One per process (the loader is process-wide). */
typedef struct gf_xpu_ze {
  void *loader; /* dlopen handle; kept open: a loader is not unloaded after zeInit */
  gf_xpu_ze_api api;
  ze_driver_handle_t driver;
  ze_api_version_t api_version;
  uint32_t device_count;
  ze_device_handle_t devices[GF_XPU_MAX_DEVICES];
  ze_device_properties_t properties[GF_XPU_MAX_DEVICES];
  uint32_t graph_flags[GF_XPU_MAX_DEVICES]; /* GF_ZE_GRAPH_FLAG_*, 0 when not reported */
  int graph_extension;                      /* 0 none, 1 the …Exp form, 2 the …Ext form */
  int graph_functions_found;                /* how many of the seven resolved by name */
  gf_ze_list_is_graph_capture_enabled_fn list_is_graph_capture_enabled;
} gf_xpu_ze;

/* Opens `loader_name` (libze_loader.so.1 in the backend), initialises it for GPU drivers and
 * fills ze. Refuses, with a sentence in err, when the loader is missing, no GPU driver answers,
 * the driver's API is older than GF_XPU_MIN_API_VERSION, or it has no GPU device. */
gf_status gf_xpu_ze_open(const char *loader_name, gf_xpu_ze *ze, gf_error *err);

/* 1 when graphs can be captured on device `index` as far as Level Zero can tell: it exists, has a
 * compute engine, takes SPIR-V modules and, when `native_graphs` (SYCL recording straight into
 * Level Zero graphs), reports immutable graph support. Else 0 and why. */
int gf_xpu_ze_device_usable(const gf_xpu_ze *ze, int index, int native_graphs, char *why,
                            size_t why_capacity);

/* A loader handle as the driver knows it: extension functions are called by the driver directly,
 * so under loader intercept (or with a second driver) they must receive the driver's handle. */
gf_status gf_xpu_ze_translate(const gf_xpu_ze *ze, zel_handle_type_t type, void *handle,
                              void **driver_handle, gf_error *err);

/* Whether a Level Zero graph capture is recording into `list` (translated first): 1 yes, 0 no or
 * the extension is absent, a negative value when the query failed. */
int gf_xpu_ze_list_capturing(const gf_xpu_ze *ze, ze_command_list_handle_t list);

/* A Level Zero failure as a status: GF_ERR_BACKEND and "graphed: <what> failed (result)". */
gf_status gf_xpu_ze_failed(gf_error *err, const char *what, ze_result_t result);

/* ---- the gather-copy kernel and its table protocol ---------------------------------------- */

/* One table entry, as the kernel reads it (24 bytes, no padding). */
typedef struct gf_xpu_gather_entry {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
} gf_xpu_gather_entry;

/* The kernel built for one device in one context: its module and kernel. A borrowed context (the
 * one torch's queue uses) is not destroyed with it; an owned one is. */
typedef struct gf_xpu_gather {
  const gf_xpu_ze *ze;
  ze_context_handle_t context;
  int owns_context;
  ze_device_handle_t device;
  ze_module_handle_t module;
  ze_kernel_handle_t kernel;
} gf_xpu_gather;

/* The embedded SPIR-V (empty when the build had no SPIR-V compiler). */
extern const unsigned char gf_xpu_gather_spirv[];
extern const size_t gf_xpu_gather_spirv_size;

/* Builds the module and kernel on device; context NULL makes (and owns) a context. */
gf_status gf_xpu_gather_create(const gf_xpu_ze *ze, ze_context_handle_t context,
                               ze_device_handle_t device, gf_xpu_gather *gather, gf_error *err);
void gf_xpu_gather_destroy(gf_xpu_gather *gather);

/* Writes `count` copies into `table` (capacity entries). Refuses a count over the capacity and a
 * copy with bytes but a NULL pointer; zero-byte copies are kept (the kernel skips them). */
gf_status gf_xpu_gather_encode(const gf_copy *copies, size_t count, gf_xpu_gather_entry *table,
                               size_t capacity, gf_error *err);

/* The gather's launch over `count` entries, the one definition of its shape (see
 * gf_xpu_gather.cl): `copies` rows of `groups_per_copy` work-groups of `group_size` work-items,
 * the groups of a row striding over one entry's bytes. Level Zero counts groups as
 * (groups_per_copy, copies, 1); SYCL names the same launch with its dimensions reversed. */
typedef struct gf_xpu_gather_launch {
  uint32_t copies;
  uint32_t groups_per_copy;
  uint32_t group_size;
} gf_xpu_gather_launch;

static inline gf_xpu_gather_launch gf_xpu_gather_launch_of(uint32_t count) {
  gf_xpu_gather_launch launch = {count, GF_XPU_GATHER_GROUPS_PER_COPY, GF_XPU_GATHER_GROUP_SIZE};
  return launch;
}

#ifdef __cplusplus
}
#endif

#endif /* GF_XPU_LEVEL_ZERO_H */
