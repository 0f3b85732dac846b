/* A Level Zero driver for tests, loaded by the real Level Zero loader through
 * ZE_ENABLE_ALT_DRIVERS, so the XPU backend's C half is tested through the loader (and its
 * validation layer) on a machine without an Intel GPU. It emulates on host memory only the subset
 * the backend uses: discovery (driver, devices and their properties with the graph-capability
 * pNext, extensions and extension functions), contexts, host and device memory, immediate command
 * lists, event pools and events, modules (SPIR-V is checked for its magic number, not compiled)
 * and kernels: a launch of gf_xpu_gather runs the gather in C from the table its first argument
 * points at. Handles carry a magic word, so a loader handle that reaches a driver entry point
 * (an extension call without translation) is refused as foreign.
 *
 * Set-up through the environment: GF_TEST_ZE_API_VERSION ("1.2"), GF_TEST_ZE_DEVICES (count),
 * GF_TEST_ZE_GRAPH_FLAGS (the device's graph flags), GF_TEST_ZE_GRAPH_EXTENSION=0 (no graph
 * extension listed). Counters for the tests: gf_test_driver_live_objects (handles and
 * allocations not yet released) and gf_test_driver_submissions (appends to command lists). */
#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GF_EXPORT __attribute__((visibility("default")))

enum {
  MAGIC_DRIVER = 0x44525652,
  MAGIC_DEVICE,
  MAGIC_CONTEXT,
  MAGIC_LIST,
  MAGIC_POOL,
  MAGIC_EVENT,
  MAGIC_MODULE,
  MAGIC_KERNEL,
  MAGIC_FREED = 0x0dead
};
enum { MAX_DEVICES = 4, MAX_ALLOCATIONS = 256 };

typedef struct object {
  uint32_t magic;
} object;
typedef struct device {
  uint32_t magic;
  uint32_t index;
} device;
typedef struct list {
  uint32_t magic;
  int capturing;
} list;
typedef struct event {
  uint32_t magic;
  int signaled;
} event;
typedef struct kernel {
  uint32_t magic;
  uint64_t table;
  uint32_t count;
  uint32_t group_size[3];
} kernel;

static object the_driver = {MAGIC_DRIVER};
static device the_devices[MAX_DEVICES];
static long live_objects;
static long submissions;
static void *allocations[MAX_ALLOCATIONS];

GF_EXPORT long gf_test_driver_live_objects(void) { return live_objects; }
GF_EXPORT long gf_test_driver_submissions(void) { return submissions; }

static int env_int(const char *name, int fallback) {
  const char *value = getenv(name);
  return value != NULL && value[0] != '\0' ? atoi(value) : fallback;
}

static ze_api_version_t api_version(void) {
  const char *value = getenv("GF_TEST_ZE_API_VERSION");
  unsigned major = 1, minor = 4;
  if (value != NULL) {
    sscanf(value, "%u.%u", &major, &minor);
  }
  return ZE_MAKE_VERSION(major, minor);
}

static uint32_t device_count(void) {
  int count = env_int("GF_TEST_ZE_DEVICES", 1);
  return count < 0 ? 0 : count > MAX_DEVICES ? MAX_DEVICES : (uint32_t)count;
}

static void *make(uint32_t magic, size_t size) {
  object *made = calloc(1, size);
  if (made != NULL) {
    made->magic = magic;
    live_objects += 1;
  }
  return made;
}

static int is(const void *handle, uint32_t magic) {
  return handle != NULL && ((const object *)handle)->magic == magic;
}

static ze_result_t release(void *handle, uint32_t magic) {
  if (!is(handle, magic)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ((object *)handle)->magic = MAGIC_FREED;
  free(handle);
  live_objects -= 1;
  return ZE_RESULT_SUCCESS;
}

/* ---- discovery ---------------------------------------------------------------------------- */

static ze_result_t ZE_APICALL Init(ze_init_flags_t flags) {
  (void)flags;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DriverGet(uint32_t *count, ze_driver_handle_t *drivers) {
  if (*count == 0 || drivers == NULL) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  drivers[0] = (ze_driver_handle_t)&the_driver;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DriverGetApiVersion(ze_driver_handle_t driver,
                                                  ze_api_version_t *version) {
  if (!is(driver, MAGIC_DRIVER)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *version = api_version();
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DriverGetProperties(ze_driver_handle_t driver,
                                                  ze_driver_properties_t *properties) {
  if (!is(driver, MAGIC_DRIVER)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  memset(properties->uuid.id, 0x47, sizeof properties->uuid.id);
  properties->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DriverGetExtensionProperties(
    ze_driver_handle_t driver, uint32_t *count, ze_driver_extension_properties_t *extensions) {
  if (!is(driver, MAGIC_DRIVER)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  uint32_t available = env_int("GF_TEST_ZE_GRAPH_EXTENSION", 1) ? 1 : 0;
  if (extensions == NULL || *count == 0) {
    *count = available;
    return ZE_RESULT_SUCCESS;
  }
  *count = *count < available ? *count : available;
  if (*count > 0) {
    snprintf(extensions[0].name, ZE_MAX_EXTENSION_NAME, "ZE_experimental_record_replay_graph");
    extensions[0].version = ZE_MAKE_VERSION(1, 0);
  }
  return ZE_RESULT_SUCCESS;
}

/* The record-and-replay graph functions, Exp form: capture state on the list; the rest exist so
 * that the extension is whole (the backend only queries the capture state). */
static ze_result_t ZE_APICALL BeginGraphCaptureExp(ze_command_list_handle_t handle, void *next) {
  (void)next;
  if (!is(handle, MAGIC_LIST)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; /* a loader handle: foreign to this driver */
  }
  ((list *)handle)->capturing = 1;
  return ZE_RESULT_SUCCESS;
}
static ze_result_t ZE_APICALL EndGraphCaptureExp(ze_command_list_handle_t handle, void **graph,
                                                 void *next) {
  (void)next;
  if (!is(handle, MAGIC_LIST)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ((list *)handle)->capturing = 0;
  if (graph != NULL) {
    *graph = NULL;
  }
  return ZE_RESULT_SUCCESS;
}
static ze_result_t ZE_APICALL IsGraphCaptureEnabledExp(ze_command_list_handle_t handle) {
  if (!is(handle, MAGIC_LIST)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  return ((list *)handle)->capturing ? (ze_result_t)0x7fff0000 : (ze_result_t)0x7fff0001;
}
static ze_result_t ZE_APICALL UnsupportedGraphCall(void) {
  return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
}

static ze_result_t ZE_APICALL DriverGetExtensionFunctionAddress(ze_driver_handle_t driver,
                                                                const char *name, void **address) {
  if (!is(driver, MAGIC_DRIVER) || name == NULL) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *address = NULL;
  if (!env_int("GF_TEST_ZE_GRAPH_EXTENSION", 1)) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  static const char *const stubs[] = {"zeCommandListInstantiateGraphExp",
                                      "zeCommandListAppendGraphExp", "zeGraphDestroyExp",
                                      "zeExecutableGraphDestroyExp"};
  if (strcmp(name, "zeCommandListBeginGraphCaptureExp") == 0) {
    *address = (void *)BeginGraphCaptureExp;
  } else if (strcmp(name, "zeCommandListEndGraphCaptureExp") == 0) {
    *address = (void *)EndGraphCaptureExp;
  } else if (strcmp(name, "zeCommandListIsGraphCaptureEnabledExp") == 0) {
    *address = (void *)IsGraphCaptureEnabledExp;
  } else {
    for (size_t i = 0; i < sizeof stubs / sizeof stubs[0]; ++i) {
      if (strcmp(name, stubs[i]) == 0) {
        *address = (void *)UnsupportedGraphCall;
      }
    }
  }
  return *address != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

static ze_result_t ZE_APICALL DeviceGet(ze_driver_handle_t driver, uint32_t *count,
                                        ze_device_handle_t *devices) {
  if (!is(driver, MAGIC_DRIVER)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  uint32_t available = device_count();
  if (devices == NULL || *count == 0) {
    *count = available;
    return ZE_RESULT_SUCCESS;
  }
  *count = *count < available ? *count : available;
  for (uint32_t i = 0; i < *count; ++i) {
    the_devices[i].magic = MAGIC_DEVICE;
    the_devices[i].index = i;
    devices[i] = (ze_device_handle_t)&the_devices[i];
  }
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DeviceGetProperties(ze_device_handle_t handle,
                                                  ze_device_properties_t *properties) {
  if (!is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  properties->type = ZE_DEVICE_TYPE_GPU;
  properties->vendorId = 0x8086;
  properties->deviceId = 0x0bd5;
  properties->maxMemAllocSize = 1u << 30;
  properties->numEUsPerSubslice = 8;
  properties->numSubslicesPerSlice = 4;
  properties->numSlices = 1;
  snprintf(properties->name, ZE_MAX_DEVICE_NAME, "graphed test GPU %u", ((device *)handle)->index);
  for (ze_base_properties_t *next = properties->pNext; next != NULL; next = next->pNext) {
    if ((uint32_t)next->stype == 0x00030029u) {
      struct graph_properties {
        ze_structure_type_t stype;
        void *pNext;
        uint32_t graphFlags;
      } *graph = (struct graph_properties *)next;
      graph->graphFlags = (uint32_t)env_int("GF_TEST_ZE_GRAPH_FLAGS", 1);
    }
  }
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DeviceGetModuleProperties(ze_device_handle_t handle,
                                                        ze_device_module_properties_t *module) {
  if (!is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  module->spirvVersionSupported = ZE_MAKE_VERSION(1, 2);
  module->maxArgumentsSize = 2048;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL DeviceGetCommandQueueGroupProperties(
    ze_device_handle_t handle, uint32_t *count, ze_command_queue_group_properties_t *groups) {
  if (!is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (groups == NULL || *count == 0) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  groups[0].flags =
      ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE | ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
  groups[0].maxMemoryFillPatternSize = 16;
  groups[0].numQueues = 1;
  return ZE_RESULT_SUCCESS;
}

/* ---- contexts and memory ------------------------------------------------------------------ */

static ze_result_t ZE_APICALL ContextCreate(ze_driver_handle_t driver,
                                            const ze_context_desc_t *desc,
                                            ze_context_handle_t *context) {
  (void)desc;
  if (!is(driver, MAGIC_DRIVER)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *context = make(MAGIC_CONTEXT, sizeof(object));
  return *context != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL ContextDestroy(ze_context_handle_t context) {
  return release(context, MAGIC_CONTEXT);
}

static ze_result_t allocate(ze_context_handle_t context, size_t size, size_t alignment,
                            void **out) {
  if (!is(context, MAGIC_CONTEXT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (alignment == 0) {
    alignment = 64;
  }
  for (int i = 0; i < MAX_ALLOCATIONS; ++i) {
    if (allocations[i] == NULL) {
      if (posix_memalign(&allocations[i], alignment, size == 0 ? 1 : size) != 0) {
        allocations[i] = NULL;
        return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
      }
      *out = allocations[i];
      live_objects += 1;
      return ZE_RESULT_SUCCESS;
    }
  }
  return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
}

static ze_result_t ZE_APICALL MemAllocDevice(ze_context_handle_t context,
                                             const ze_device_mem_alloc_desc_t *desc, size_t size,
                                             size_t alignment, ze_device_handle_t handle,
                                             void **out) {
  (void)desc;
  if (!is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  return allocate(context, size, alignment, out);
}

static ze_result_t ZE_APICALL MemAllocHost(ze_context_handle_t context,
                                           const ze_host_mem_alloc_desc_t *desc, size_t size,
                                           size_t alignment, void **out) {
  (void)desc;
  return allocate(context, size, alignment, out);
}

static ze_result_t ZE_APICALL MemFree(ze_context_handle_t context, void *pointer) {
  if (!is(context, MAGIC_CONTEXT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  for (int i = 0; i < MAX_ALLOCATIONS; ++i) {
    if (allocations[i] != NULL && allocations[i] == pointer) {
      free(pointer);
      allocations[i] = NULL;
      live_objects -= 1;
      return ZE_RESULT_SUCCESS;
    }
  }
  return ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

/* ---- modules and kernels ------------------------------------------------------------------ */

static ze_result_t ZE_APICALL ModuleCreate(ze_context_handle_t context, ze_device_handle_t handle,
                                           const ze_module_desc_t *desc, ze_module_handle_t *module,
                                           ze_module_build_log_handle_t *log) {
  if (!is(context, MAGIC_CONTEXT) || !is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (log != NULL) {
    *log = NULL;
  }
  uint32_t magic = 0;
  if (desc->format != ZE_MODULE_FORMAT_IL_SPIRV || desc->inputSize < 20 ||
      (memcpy(&magic, desc->pInputModule, 4), magic != 0x07230203u)) {
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  *module = make(MAGIC_MODULE, sizeof(object));
  return *module != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL ModuleDestroy(ze_module_handle_t module) {
  return release(module, MAGIC_MODULE);
}

static ze_result_t ZE_APICALL KernelCreate(ze_module_handle_t module, const ze_kernel_desc_t *desc,
                                           ze_kernel_handle_t *out) {
  if (!is(module, MAGIC_MODULE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (desc->pKernelName == NULL || strcmp(desc->pKernelName, "gf_xpu_gather") != 0) {
    return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
  }
  *out = make(MAGIC_KERNEL, sizeof(kernel));
  return *out != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL KernelDestroy(ze_kernel_handle_t handle) {
  return release(handle, MAGIC_KERNEL);
}

static ze_result_t ZE_APICALL KernelSetGroupSize(ze_kernel_handle_t handle, uint32_t x, uint32_t y,
                                                 uint32_t z) {
  if (!is(handle, MAGIC_KERNEL)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  kernel *k = (kernel *)handle;
  k->group_size[0] = x;
  k->group_size[1] = y;
  k->group_size[2] = z;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL KernelSetArgumentValue(ze_kernel_handle_t handle, uint32_t index,
                                                     size_t size, const void *value) {
  if (!is(handle, MAGIC_KERNEL)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  kernel *k = (kernel *)handle;
  if (index == 0 && size == sizeof(uint64_t)) {
    memcpy(&k->table, value, sizeof k->table);
  } else if (index == 1 && size == sizeof(uint32_t)) {
    memcpy(&k->count, value, sizeof k->count);
  } else {
    return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
  }
  return ZE_RESULT_SUCCESS;
}

/* ---- command lists and events ------------------------------------------------------------- */

static ze_result_t ZE_APICALL CommandListCreateImmediate(ze_context_handle_t context,
                                                         ze_device_handle_t handle,
                                                         const ze_command_queue_desc_t *desc,
                                                         ze_command_list_handle_t *out) {
  (void)desc;
  if (!is(context, MAGIC_CONTEXT) || !is(handle, MAGIC_DEVICE)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *out = make(MAGIC_LIST, sizeof(list));
  return *out != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL CommandListDestroy(ze_command_list_handle_t handle) {
  return release(handle, MAGIC_LIST);
}

static ze_result_t waits_done(uint32_t count, ze_event_handle_t *waits) {
  for (uint32_t i = 0; i < count; ++i) {
    if (!is(waits[i], MAGIC_EVENT)) {
      return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (!((event *)waits[i])->signaled) {
      return ZE_RESULT_ERROR_NOT_AVAILABLE; /* everything here runs at once, in order */
    }
  }
  return ZE_RESULT_SUCCESS;
}

static ze_result_t signal(ze_event_handle_t handle) {
  if (handle == NULL) {
    return ZE_RESULT_SUCCESS;
  }
  if (!is(handle, MAGIC_EVENT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ((event *)handle)->signaled = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL AppendMemoryCopy(ze_command_list_handle_t handle, void *dst,
                                               const void *src, size_t size,
                                               ze_event_handle_t signal_event, uint32_t wait_count,
                                               ze_event_handle_t *waits) {
  if (!is(handle, MAGIC_LIST)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ze_result_t result = waits_done(wait_count, waits);
  if (result != ZE_RESULT_SUCCESS) {
    return result;
  }
  submissions += 1;
  memmove(dst, src, size);
  return signal(signal_event);
}

static ze_result_t ZE_APICALL AppendLaunchKernel(ze_command_list_handle_t handle,
                                                 ze_kernel_handle_t kernel_handle,
                                                 const ze_group_count_t *groups,
                                                 ze_event_handle_t signal_event,
                                                 uint32_t wait_count, ze_event_handle_t *waits) {
  if (!is(handle, MAGIC_LIST) || !is(kernel_handle, MAGIC_KERNEL)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ze_result_t result = waits_done(wait_count, waits);
  if (result != ZE_RESULT_SUCCESS) {
    return result;
  }
  const kernel *k = (const kernel *)kernel_handle;
  if (k->group_size[0] == 0 || groups->groupCountY < k->count) {
    return ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
  }
  submissions += 1;
  /* The gather of gf_xpu_gather.cl, on host memory. */
  const uint64_t *table = (const uint64_t *)(uintptr_t)k->table;
  for (uint32_t i = 0; i < k->count; ++i) {
    memmove((void *)(uintptr_t)table[3 * i + 1], (const void *)(uintptr_t)table[3 * i],
            (size_t)table[3 * i + 2]);
  }
  return signal(signal_event);
}

static ze_result_t ZE_APICALL EventPoolCreate(ze_context_handle_t context,
                                              const ze_event_pool_desc_t *desc, uint32_t devices,
                                              ze_device_handle_t *device_handles,
                                              ze_event_pool_handle_t *out) {
  (void)desc;
  (void)devices;
  (void)device_handles;
  if (!is(context, MAGIC_CONTEXT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *out = make(MAGIC_POOL, sizeof(object));
  return *out != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL EventPoolDestroy(ze_event_pool_handle_t pool) {
  return release(pool, MAGIC_POOL);
}

static ze_result_t ZE_APICALL EventCreate(ze_event_pool_handle_t pool, const ze_event_desc_t *desc,
                                          ze_event_handle_t *out) {
  (void)desc;
  if (!is(pool, MAGIC_POOL)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  *out = make(MAGIC_EVENT, sizeof(event));
  return *out != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL EventDestroy(ze_event_handle_t handle) {
  return release(handle, MAGIC_EVENT);
}

static ze_result_t ZE_APICALL EventHostSynchronize(ze_event_handle_t handle, uint64_t timeout) {
  (void)timeout;
  if (!is(handle, MAGIC_EVENT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  return ((event *)handle)->signaled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

static ze_result_t ZE_APICALL EventHostReset(ze_event_handle_t handle) {
  if (!is(handle, MAGIC_EVENT)) {
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  ((event *)handle)->signaled = 0;
  return ZE_RESULT_SUCCESS;
}

/* ---- the tables the loader asks for ------------------------------------------------------- */

static void fill(ze_global_dditable_t *t) { t->pfnInit = Init; }
static void fill_driver(ze_driver_dditable_t *t) {
  t->pfnGet = DriverGet;
  t->pfnGetApiVersion = DriverGetApiVersion;
  t->pfnGetProperties = DriverGetProperties;
  t->pfnGetExtensionProperties = DriverGetExtensionProperties;
  t->pfnGetExtensionFunctionAddress = DriverGetExtensionFunctionAddress;
}
static void fill_device(ze_device_dditable_t *t) {
  t->pfnGet = DeviceGet;
  t->pfnGetProperties = DeviceGetProperties;
  t->pfnGetModuleProperties = DeviceGetModuleProperties;
  t->pfnGetCommandQueueGroupProperties = DeviceGetCommandQueueGroupProperties;
}
static void fill_context(ze_context_dditable_t *t) {
  t->pfnCreate = ContextCreate;
  t->pfnDestroy = ContextDestroy;
}
static void fill_mem(ze_mem_dditable_t *t) {
  t->pfnAllocDevice = MemAllocDevice;
  t->pfnAllocHost = MemAllocHost;
  t->pfnFree = MemFree;
}
static void fill_module(ze_module_dditable_t *t) {
  t->pfnCreate = ModuleCreate;
  t->pfnDestroy = ModuleDestroy;
}
static void fill_kernel(ze_kernel_dditable_t *t) {
  t->pfnCreate = KernelCreate;
  t->pfnDestroy = KernelDestroy;
  t->pfnSetGroupSize = KernelSetGroupSize;
  t->pfnSetArgumentValue = KernelSetArgumentValue;
}
static void fill_command_list(ze_command_list_dditable_t *t) {
  t->pfnCreateImmediate = CommandListCreateImmediate;
  t->pfnDestroy = CommandListDestroy;
  t->pfnAppendMemoryCopy = AppendMemoryCopy;
  t->pfnAppendLaunchKernel = AppendLaunchKernel;
}
static void fill_event_pool(ze_event_pool_dditable_t *t) {
  t->pfnCreate = EventPoolCreate;
  t->pfnDestroy = EventPoolDestroy;
}
static void fill_event(ze_event_dditable_t *t) {
  t->pfnCreate = EventCreate;
  t->pfnDestroy = EventDestroy;
  t->pfnHostSynchronize = EventHostSynchronize;
  t->pfnHostReset = EventHostReset;
}

/* Every table of the loader's headers is exported (1.8.12 needs the ze, zet and zes ones); those
 * this driver does not serve stay zeroed. */
#define GF_TABLE(name, type)                                                                       \
  GF_EXPORT ze_result_t ZE_APICALL name(ze_api_version_t version, type *table) {                   \
    if (table == NULL) {                                                                           \
      return ZE_RESULT_ERROR_INVALID_NULL_POINTER;                                                 \
    }                                                                                              \
    if (ZE_MAJOR_VERSION(version) != 1) {                                                          \
      return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;                                                  \
    }                                                                                              \
    memset(table, 0, sizeof *table);                                                               \
    GF_FILL_##name(table);                                                                         \
    return ZE_RESULT_SUCCESS;                                                                      \
  }
#define GF_FILL_NOTHING(table) (void)(table)
#define GF_FILL_zeGetGlobalProcAddrTable fill
#define GF_FILL_zeGetDriverProcAddrTable fill_driver
#define GF_FILL_zeGetDeviceProcAddrTable fill_device
#define GF_FILL_zeGetDeviceExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetContextProcAddrTable fill_context
#define GF_FILL_zeGetCommandQueueProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetCommandListProcAddrTable fill_command_list
#define GF_FILL_zeGetImageProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetImageExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetFenceProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetEventPoolProcAddrTable fill_event_pool
#define GF_FILL_zeGetEventProcAddrTable fill_event
#define GF_FILL_zeGetEventExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetModuleProcAddrTable fill_module
#define GF_FILL_zeGetModuleBuildLogProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetKernelProcAddrTable fill_kernel
#define GF_FILL_zeGetKernelExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetSamplerProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetPhysicalMemProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetMemProcAddrTable fill_mem
#define GF_FILL_zeGetVirtualMemProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetFabricVertexExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zeGetFabricEdgeExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetDeviceProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetContextProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetCommandListProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetModuleProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetKernelProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricGroupProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricGroupExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricStreamerProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricQueryPoolProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetMetricQueryProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetTracerExpProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zetGetDebugProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetDriverProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetDeviceProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetSchedulerProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetPerformanceFactorProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetPowerProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetFrequencyProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetEngineProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetStandbyProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetFirmwareProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetMemoryProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetFabricPortProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetTemperatureProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetPsuProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetFanProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetLedProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetRasProcAddrTable GF_FILL_NOTHING
#define GF_FILL_zesGetDiagnosticsProcAddrTable GF_FILL_NOTHING
GF_TABLE(zeGetGlobalProcAddrTable, ze_global_dditable_t)
GF_TABLE(zeGetDriverProcAddrTable, ze_driver_dditable_t)
GF_TABLE(zeGetDeviceProcAddrTable, ze_device_dditable_t)
GF_TABLE(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)
GF_TABLE(zeGetContextProcAddrTable, ze_context_dditable_t)
GF_TABLE(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)
GF_TABLE(zeGetCommandListProcAddrTable, ze_command_list_dditable_t)
GF_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
GF_TABLE(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)
GF_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
GF_TABLE(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
GF_TABLE(zeGetEventProcAddrTable, ze_event_dditable_t)
GF_TABLE(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)
GF_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
GF_TABLE(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
GF_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
GF_TABLE(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)
GF_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
GF_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
GF_TABLE(zeGetMemProcAddrTable, ze_mem_dditable_t)
GF_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)
GF_TABLE(zeGetFabricVertexExpProcAddrTable, ze_fabric_vertex_exp_dditable_t)
GF_TABLE(zeGetFabricEdgeExpProcAddrTable, ze_fabric_edge_exp_dditable_t)
GF_TABLE(zetGetDeviceProcAddrTable, zet_device_dditable_t)
GF_TABLE(zetGetContextProcAddrTable, zet_context_dditable_t)
GF_TABLE(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
GF_TABLE(zetGetModuleProcAddrTable, zet_module_dditable_t)
GF_TABLE(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
GF_TABLE(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
GF_TABLE(zetGetMetricGroupExpProcAddrTable, zet_metric_group_exp_dditable_t)
GF_TABLE(zetGetMetricProcAddrTable, zet_metric_dditable_t)
GF_TABLE(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
GF_TABLE(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
GF_TABLE(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
GF_TABLE(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)
GF_TABLE(zetGetDebugProcAddrTable, zet_debug_dditable_t)
GF_TABLE(zesGetDriverProcAddrTable, zes_driver_dditable_t)
GF_TABLE(zesGetDeviceProcAddrTable, zes_device_dditable_t)
GF_TABLE(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
GF_TABLE(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
GF_TABLE(zesGetPowerProcAddrTable, zes_power_dditable_t)
GF_TABLE(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
GF_TABLE(zesGetEngineProcAddrTable, zes_engine_dditable_t)
GF_TABLE(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
GF_TABLE(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
GF_TABLE(zesGetMemoryProcAddrTable, zes_memory_dditable_t)
GF_TABLE(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
GF_TABLE(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
GF_TABLE(zesGetPsuProcAddrTable, zes_psu_dditable_t)
GF_TABLE(zesGetFanProcAddrTable, zes_fan_dditable_t)
GF_TABLE(zesGetLedProcAddrTable, zes_led_dditable_t)
GF_TABLE(zesGetRasProcAddrTable, zes_ras_dditable_t)
GF_TABLE(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
