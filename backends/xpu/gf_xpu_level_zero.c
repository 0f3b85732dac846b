/* The Level Zero half of the XPU backend (see gf_xpu_level_zero.h): every call goes through
 * pointers found with dlsym in the loader, so nothing here links against it. */
#include "gf_xpu_level_zero.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GF_ZE_VERSION_MAJOR(v) ((unsigned)(v) >> 16)
#define GF_ZE_VERSION_MINOR(v) ((unsigned)(v)&0xffffu)

static const char *const gf_xpu_graph_function_names[GF_ZE_GRAPH_FUNCTION_COUNT] = {
    "zeCommandListBeginGraphCapture",
    "zeCommandListEndGraphCapture",
    "zeCommandListInstantiateGraph",
    "zeCommandListAppendGraph",
    "zeGraphDestroy",
    "zeExecutableGraphDestroy",
    "zeCommandListIsGraphCaptureEnabled"};

/* Finds every entry point; a loader that lacks one is refused (LoaderTranslateHandle is
 * optional). */
static gf_status gf_xpu_ze_load_api(void *loader, gf_xpu_ze_api *api, gf_error *err) {
  struct {
    void **slot;
    const char *name;
  } entries[] = {
#define GF_ZE_ENTRY(field) {(void **)&api->field, "ze" #field}
      GF_ZE_ENTRY(Init),
      GF_ZE_ENTRY(DriverGet),
      GF_ZE_ENTRY(DriverGetApiVersion),
      GF_ZE_ENTRY(DriverGetExtensionProperties),
      GF_ZE_ENTRY(DriverGetExtensionFunctionAddress),
      GF_ZE_ENTRY(DeviceGet),
      GF_ZE_ENTRY(DeviceGetProperties),
      GF_ZE_ENTRY(DeviceGetModuleProperties),
      GF_ZE_ENTRY(DeviceGetCommandQueueGroupProperties),
      GF_ZE_ENTRY(ContextCreate),
      GF_ZE_ENTRY(ContextDestroy),
      GF_ZE_ENTRY(MemAllocDevice),
      GF_ZE_ENTRY(MemAllocHost),
      GF_ZE_ENTRY(MemFree),
      GF_ZE_ENTRY(ModuleCreate),
      GF_ZE_ENTRY(ModuleDestroy),
      GF_ZE_ENTRY(KernelCreate),
      GF_ZE_ENTRY(KernelDestroy),
      GF_ZE_ENTRY(KernelSetGroupSize),
      GF_ZE_ENTRY(KernelSetArgumentValue),
      GF_ZE_ENTRY(CommandListCreateImmediate),
      GF_ZE_ENTRY(CommandListDestroy),
      GF_ZE_ENTRY(CommandListAppendMemoryCopy),
      GF_ZE_ENTRY(CommandListAppendLaunchKernel),
      GF_ZE_ENTRY(EventPoolCreate),
      GF_ZE_ENTRY(EventPoolDestroy),
      GF_ZE_ENTRY(EventCreate),
      GF_ZE_ENTRY(EventDestroy),
      GF_ZE_ENTRY(EventHostSynchronize),
      GF_ZE_ENTRY(EventHostReset),
#undef GF_ZE_ENTRY
  };
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; ++i) {
    *entries[i].slot = dlsym(loader, entries[i].name);
    if (*entries[i].slot == NULL) {
      return gf_error_set(err, GF_ERR_BACKEND, "the Level Zero loader lacks %s", entries[i].name);
    }
  }
  *(void **)&api->LoaderTranslateHandle = dlsym(loader, "zelLoaderTranslateHandle");
  return GF_OK;
}

/* Which form of the graph extension the driver lists (0 none, 1 Exp, 2 Ext). */
static int gf_xpu_ze_graph_extension(gf_xpu_ze *ze) {
  uint32_t count = 0;
  if (ze->api.DriverGetExtensionProperties(ze->driver, &count, NULL) != ZE_RESULT_SUCCESS ||
      count == 0) {
    return 0;
  }
  ze_driver_extension_properties_t *extensions = calloc(count, sizeof *extensions);
  if (extensions == NULL) {
    return 0;
  }
  int form = 0;
  if (ze->api.DriverGetExtensionProperties(ze->driver, &count, extensions) == ZE_RESULT_SUCCESS) {
    for (uint32_t i = 0; i < count; ++i) {
      extensions[i].name[ZE_MAX_EXTENSION_NAME - 1] = '\0';
      if (strcmp(extensions[i].name, GF_ZE_GRAPH_EXTENSION_EXT) == 0) {
        form = 2;
      } else if (strcmp(extensions[i].name, GF_ZE_GRAPH_EXTENSION_EXP) == 0 && form == 0) {
        form = 1;
      }
    }
  }
  free(extensions);
  return form;
}

/* Looks the graph functions up by name, the standard (Ext) names first, then Exp. */
static void gf_xpu_ze_resolve_graph_functions(gf_xpu_ze *ze) {
  ze->graph_functions_found = 0;
  ze->list_is_graph_capture_enabled = NULL;
  for (int i = 0; i < GF_ZE_GRAPH_FUNCTION_COUNT; ++i) {
    void *found = NULL;
    static const char *const suffixes[] = {"Ext", "Exp"};
    for (int s = 0; s < 2 && found == NULL; ++s) {
      char name[96];
      snprintf(name, sizeof name, "%s%s", gf_xpu_graph_function_names[i], suffixes[s]);
      if (ze->api.DriverGetExtensionFunctionAddress(ze->driver, name, &found) !=
          ZE_RESULT_SUCCESS) {
        found = NULL;
      }
    }
    if (found != NULL) {
      ze->graph_functions_found += 1;
      if (i == GF_ZE_GRAPH_FUNCTION_COUNT - 1) {
        *(void **)&ze->list_is_graph_capture_enabled = found;
      }
    }
  }
}

/* The first driver with a GPU device into ze->driver; an old driver is refused only if no other
 * serves. */
static gf_status gf_xpu_ze_pick_driver(gf_xpu_ze *ze, gf_error *err) {
  ze_result_t result = ze->api.Init(ZE_INIT_FLAG_GPU_ONLY);
  uint32_t driver_count = 0;
  if (result == ZE_RESULT_SUCCESS) {
    result = ze->api.DriverGet(&driver_count, NULL);
  }
  if (result != ZE_RESULT_SUCCESS || driver_count == 0) {
    return gf_error_set(err, GF_ERR_NOT_FOUND,
                        "the Level Zero loader found no GPU driver (result 0x%x)",
                        (unsigned)result);
  }
  ze_driver_handle_t drivers[8];
  if (driver_count > 8) {
    driver_count = 8;
  }
  result = ze->api.DriverGet(&driver_count, drivers);
  if (result != ZE_RESULT_SUCCESS) {
    return gf_error_set(err, GF_ERR_BACKEND, "zeDriverGet failed (result 0x%x)", (unsigned)result);
  }
  char refused[256] = "";
  for (uint32_t d = 0; d < driver_count && ze->driver == NULL; ++d) {
    ze_api_version_t version = 0;
    if (ze->api.DriverGetApiVersion(drivers[d], &version) != ZE_RESULT_SUCCESS) {
      continue;
    }
    uint32_t devices = 0;
    if (ze->api.DeviceGet(drivers[d], &devices, NULL) != ZE_RESULT_SUCCESS || devices == 0) {
      continue;
    }
    if ((unsigned)version < (unsigned)GF_XPU_MIN_API_VERSION) {
      snprintf(refused, sizeof refused,
               "the Level Zero driver reports API %u.%u; graphed needs %u.%u or later (update "
               "the GPU driver)",
               GF_ZE_VERSION_MAJOR(version), GF_ZE_VERSION_MINOR(version),
               GF_ZE_VERSION_MAJOR(GF_XPU_MIN_API_VERSION),
               GF_ZE_VERSION_MINOR(GF_XPU_MIN_API_VERSION));
      continue;
    }
    ze->driver = drivers[d];
    ze->api_version = version;
    ze->device_count = devices > GF_XPU_MAX_DEVICES ? GF_XPU_MAX_DEVICES : devices;
  }
  if (ze->driver == NULL) {
    if (refused[0] != '\0') {
      return gf_error_set(err, GF_ERR_NOT_FOUND, "%s", refused);
    }
    return gf_error_set(err, GF_ERR_NOT_FOUND,
                        "the Level Zero GPU driver reports no device (%u driver(s))",
                        (unsigned)driver_count);
  }
  return GF_OK;
}

/* The chosen driver's devices, their properties and graph flags. */
static gf_status gf_xpu_ze_read_devices(gf_xpu_ze *ze, gf_error *err) {
  ze_result_t result = ze->api.DeviceGet(ze->driver, &ze->device_count, ze->devices);
  if (result != ZE_RESULT_SUCCESS) {
    return gf_error_set(err, GF_ERR_BACKEND, "zeDeviceGet failed (result 0x%x)", (unsigned)result);
  }
  for (uint32_t i = 0; i < ze->device_count; ++i) {
    gf_ze_record_replay_graph_properties graph = {
        .stype = GF_ZE_STRUCTURE_TYPE_RECORD_REPLAY_GRAPH_PROPERTIES};
    ze_device_properties_t *properties = &ze->properties[i];
    properties->stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    properties->pNext = &graph;
    result = ze->api.DeviceGetProperties(ze->devices[i], properties);
    if (result != ZE_RESULT_SUCCESS) {
      /* A driver that does not know the graph structure may refuse it: ask again without. */
      properties->pNext = NULL;
      graph.graphFlags = 0;
      result = ze->api.DeviceGetProperties(ze->devices[i], properties);
    }
    properties->pNext = NULL;
    if (result != ZE_RESULT_SUCCESS) {
      return gf_error_set(err, GF_ERR_BACKEND, "zeDeviceGetProperties failed (result 0x%x)",
                          (unsigned)result);
    }
    ze->graph_flags[i] = graph.graphFlags;
  }
  return GF_OK;
}

gf_status gf_xpu_ze_open(const char *loader_name, gf_xpu_ze *ze, gf_error *err) {
  memset(ze, 0, sizeof *ze);
  ze->loader = dlopen(loader_name, RTLD_LAZY | RTLD_LOCAL);
  if (ze->loader == NULL) {
    return gf_error_set(err, GF_ERR_NOT_FOUND, "the Level Zero loader (%s) is not installed",
                        loader_name);
  }
  /* On failure the loader stays open: see gf_xpu_ze.loader. */
  gf_status status = gf_xpu_ze_load_api(ze->loader, &ze->api, err);
  if (status == GF_OK) {
    status = gf_xpu_ze_pick_driver(ze, err);
  }
  if (status == GF_OK) {
    status = gf_xpu_ze_read_devices(ze, err);
  }
  if (status != GF_OK) {
    return status;
  }
  ze->graph_extension = gf_xpu_ze_graph_extension(ze);
  if (ze->graph_extension != 0) {
    gf_xpu_ze_resolve_graph_functions(ze);
  }
  return GF_OK;
}

int gf_xpu_ze_device_usable(const gf_xpu_ze *ze, int index, int native_graphs, char *why,
                            size_t why_capacity) {
  if (index < 0 || (uint32_t)index >= ze->device_count) {
    snprintf(why, why_capacity, "xpu:%d does not exist (%u Level Zero GPU device(s))", index,
             (unsigned)ze->device_count);
    return 0;
  }
  ze_device_handle_t device = ze->devices[index];
  uint32_t groups = 0;
  int compute = 0;
  if (ze->api.DeviceGetCommandQueueGroupProperties(device, &groups, NULL) == ZE_RESULT_SUCCESS &&
      groups > 0 && groups <= 64) {
    ze_command_queue_group_properties_t properties[64];
    for (uint32_t g = 0; g < groups; ++g) {
      properties[g] = (ze_command_queue_group_properties_t){
          .stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES};
    }
    if (ze->api.DeviceGetCommandQueueGroupProperties(device, &groups, properties) ==
        ZE_RESULT_SUCCESS) {
      for (uint32_t g = 0; g < groups; ++g) {
        compute |= (properties[g].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) != 0;
      }
    }
  }
  if (!compute) {
    snprintf(why, why_capacity, "xpu:%d (%s) has no compute engine", index,
             ze->properties[index].name);
    return 0;
  }
  ze_device_module_properties_t module = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES};
  if (ze->api.DeviceGetModuleProperties(device, &module) != ZE_RESULT_SUCCESS ||
      module.spirvVersionSupported < ZE_MAKE_VERSION(1, 0)) {
    snprintf(why, why_capacity,
             "xpu:%d (%s) takes no SPIR-V modules, so the copy kernel cannot "
             "be built",
             index, ze->properties[index].name);
    return 0;
  }
  if (native_graphs) {
    if (ze->graph_extension == 0 || ze->graph_functions_found < GF_ZE_GRAPH_FUNCTION_COUNT) {
      snprintf(why, why_capacity,
               "native Level Zero graphs were asked for, but the driver has no record-and-replay "
               "graph extension (%d of %d functions found; compute-runtime 25.40 or later)",
               ze->graph_functions_found, GF_ZE_GRAPH_FUNCTION_COUNT);
      return 0;
    }
    if ((ze->graph_flags[index] & GF_ZE_GRAPH_FLAG_IMMUTABLE) == 0) {
      snprintf(why, why_capacity,
               "native Level Zero graphs were asked for, but xpu:%d (%s) reports no graph "
               "support (graph flags 0x%x; only Xe2 and later GPUs report it)",
               index, ze->properties[index].name, (unsigned)ze->graph_flags[index]);
      return 0;
    }
  }
  return 1;
}

gf_status gf_xpu_ze_translate(const gf_xpu_ze *ze, zel_handle_type_t type, void *handle,
                              void **driver_handle, gf_error *err) {
  *driver_handle = handle;
  if (ze->api.LoaderTranslateHandle == NULL) {
    return GF_OK;
  }
  ze_result_t result = ze->api.LoaderTranslateHandle(type, handle, driver_handle);
  if (result != ZE_RESULT_SUCCESS) {
    *driver_handle = NULL;
    return gf_error_set(err, GF_ERR_BACKEND,
                        "translating a Level Zero handle for the driver failed (result 0x%x)",
                        (unsigned)result);
  }
  return GF_OK;
}

int gf_xpu_ze_list_capturing(const gf_xpu_ze *ze, ze_command_list_handle_t list) {
  if (ze->list_is_graph_capture_enabled == NULL) {
    return 0;
  }
  void *driver_list = NULL;
  if (gf_xpu_ze_translate(ze, ZEL_HANDLE_COMMAND_LIST, list, &driver_list, NULL) != GF_OK) {
    return -1;
  }
  ze_result_t result = ze->list_is_graph_capture_enabled((ze_command_list_handle_t)driver_list);
  if (result == GF_ZE_RESULT_QUERY_TRUE) {
    return 1;
  }
  if (result == GF_ZE_RESULT_QUERY_FALSE) {
    return 0;
  }
  return -1;
}

/* ---- gather ------------------------------------------------------------------------------ */

gf_status gf_xpu_ze_failed(gf_error *err, const char *what, ze_result_t result) {
  return gf_error_set(err, GF_ERR_BACKEND, "graphed: %s failed (Level Zero result 0x%x)", what,
                      (unsigned)result);
}

gf_status gf_xpu_gather_create(const gf_xpu_ze *ze, ze_context_handle_t context,
                               ze_device_handle_t device, gf_xpu_gather *gather, gf_error *err) {
  memset(gather, 0, sizeof *gather);
  gather->ze = ze;
  gather->device = device;
  if (gf_xpu_gather_spirv_size == 0) {
    return gf_error_set(err, GF_ERR_BACKEND,
                        "graphed: this build has no SPIR-V of the XPU copy kernel");
  }
  ze_result_t result = ZE_RESULT_SUCCESS;
  if (context == NULL) {
    ze_context_desc_t desc = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    result = ze->api.ContextCreate(ze->driver, &desc, &gather->context);
    if (result != ZE_RESULT_SUCCESS) {
      gather->context = NULL;
      return gf_xpu_ze_failed(err, "creating a Level Zero context", result);
    }
    gather->owns_context = 1;
  } else {
    gather->context = context;
  }
  ze_module_desc_t module_desc = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                                  .format = ZE_MODULE_FORMAT_IL_SPIRV,
                                  .inputSize = gf_xpu_gather_spirv_size,
                                  .pInputModule = gf_xpu_gather_spirv,
                                  .pBuildFlags = ""};
  result = ze->api.ModuleCreate(gather->context, device, &module_desc, &gather->module, NULL);
  if (result != ZE_RESULT_SUCCESS) {
    gather->module = NULL;
    gf_xpu_gather_destroy(gather);
    return gf_xpu_ze_failed(err, "building the copy kernel's module from SPIR-V", result);
  }
  ze_kernel_desc_t kernel_desc = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                                  .pKernelName = "gf_xpu_gather"};
  result = ze->api.KernelCreate(gather->module, &kernel_desc, &gather->kernel);
  if (result != ZE_RESULT_SUCCESS) {
    gather->kernel = NULL;
    gf_xpu_gather_destroy(gather);
    return gf_xpu_ze_failed(err, "creating the copy kernel", result);
  }
  result = ze->api.KernelSetGroupSize(gather->kernel, GF_XPU_GATHER_GROUP_SIZE, 1, 1);
  if (result != ZE_RESULT_SUCCESS) {
    gf_xpu_gather_destroy(gather);
    return gf_xpu_ze_failed(err, "setting the copy kernel's group size", result);
  }
  return GF_OK;
}

void gf_xpu_gather_destroy(gf_xpu_gather *gather) {
  if (gather->ze == NULL) {
    return;
  }
  if (gather->kernel != NULL) {
    gather->ze->api.KernelDestroy(gather->kernel);
  }
  if (gather->module != NULL) {
    gather->ze->api.ModuleDestroy(gather->module);
  }
  if (gather->owns_context && gather->context != NULL) {
    gather->ze->api.ContextDestroy(gather->context);
  }
  memset(gather, 0, sizeof *gather);
}

gf_status gf_xpu_gather_encode(const gf_copy *copies, size_t count, gf_xpu_gather_entry *table,
                               size_t capacity, gf_error *err) {
  if (count > capacity) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                        "graphed: %zu copies do not fit a gather table of %zu entries", count,
                        capacity);
  }
  for (size_t i = 0; i < count; ++i) {
    if (copies[i].bytes > 0 && (copies[i].src == NULL || copies[i].dst == NULL)) {
      return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: copy %zu of the gather has %zu bytes but no address", i,
                          copies[i].bytes);
    }
    table[i].src = (uint64_t)(uintptr_t)copies[i].src;
    table[i].dst = (uint64_t)(uintptr_t)copies[i].dst;
    table[i].bytes = (uint64_t)copies[i].bytes;
  }
  return GF_OK;
}
