/* The Level Zero (Intel GPU) backend's load-time probe. The loader is opened with dlopen, as the
 * OpenCL ICD loader opens its drivers, so a machine without it loads graphed all the same and
 * pays one failed dlopen. The probe initialises the loader for GPU drivers only and counts them.
 *
 * Capture and replay through Level Zero command lists are not built yet: a runner on an XPU
 * device is created disabled with a reason that says so, and its calls run eager. The hooks that
 * capture would need are the same table as CUDA's (gf_backend.h); a table whose
 * graphs_supported refuses needs no other hook. */
#include "gf_xpu_backend.h"

#include <level_zero/ze_api.h>

#include <dlfcn.h>
#include <stdio.h>

typedef ze_result_t (*gf_ze_init_fn)(ze_init_flags_t flags);
typedef ze_result_t (*gf_ze_driver_get_fn)(uint32_t *count, ze_driver_handle_t *drivers);

static int gf_xpu_graphs_supported(void *context, int device_type, int device_index, char *why,
                                   size_t why_capacity) {
  (void)context;
  (void)device_type;
  (void)device_index;
  snprintf(why, why_capacity,
           "a Level Zero GPU driver is present, but capture through Level Zero command lists "
           "is not built in this release");
  return 0;
}

static const gf_backend gf_xpu_backend = {
    .name = "xpu",
    .context = NULL,
    .graphs_supported = gf_xpu_graphs_supported,
};

const gf_backend *gf_xpu_backend_probe(char *why, size_t why_capacity) {
  void *loader = dlopen("libze_loader.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (loader == NULL) {
    snprintf(why, why_capacity, "the Level Zero loader (libze_loader.so.1) is not installed");
    return NULL;
  }
  gf_ze_init_fn ze_init = (gf_ze_init_fn)dlsym(loader, "zeInit");
  gf_ze_driver_get_fn ze_driver_get = (gf_ze_driver_get_fn)dlsym(loader, "zeDriverGet");
  if (ze_init == NULL || ze_driver_get == NULL) {
    snprintf(why, why_capacity, "the Level Zero loader lacks zeInit or zeDriverGet");
    dlclose(loader);
    return NULL;
  }
  ze_result_t result = ze_init(ZE_INIT_FLAG_GPU_ONLY);
  uint32_t drivers = 0;
  if (result == ZE_RESULT_SUCCESS) {
    result = ze_driver_get(&drivers, NULL);
  }
  if (result != ZE_RESULT_SUCCESS || drivers == 0) {
    snprintf(why, why_capacity, "the Level Zero loader found no GPU driver (result 0x%x)",
             (unsigned)result);
    /* The loader stays open: unloading it after zeInit is not supported by every loader. */
    return NULL;
  }
  return &gf_xpu_backend;
}
