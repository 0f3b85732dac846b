/* The XPU backend's C half through Debian's real Level Zero loader and the project's test driver
 * (gf_ze_test_driver.c, loaded with ZE_ENABLE_ALT_DRIVERS), with the loader's validation layer and
 * handle-lifetime checks on (set by tests/xpu/CMakeLists.txt). One scenario per process, named by
 * argv[1], because the loader is initialised once per process and the driver is configured
 * through the environment. Exit 0 passes; a failure prints the check and exits 1. */
#include "gf_xpu_backend.h"
#include "gf_xpu_level_zero.h"
#include "gf_xpu_submit.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(condition)                                                                           \
  do {                                                                                             \
    if (!(condition)) {                                                                            \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition);                \
      failures += 1;                                                                               \
    }                                                                                              \
  } while (0)

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    gf_error check_err = {0};                                                                      \
    gf_status check_status = (call);                                                               \
    if (check_status != GF_OK) {                                                                   \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, check_err.message);     \
      failures += 1;                                                                               \
    }                                                                                              \
  } while (0)

static const char *loader = "libze_loader.so.1";

/* The test driver's counters, found in the copy the loader loaded. */
static long driver_counter(const char *name) {
  const char *path = getenv("ZE_ENABLE_ALT_DRIVERS");
  void *driver = path != NULL ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
  long (*counter)(void) = driver != NULL ? (long (*)(void))dlsym(driver, name) : NULL;
  long value = counter != NULL ? counter() : -1;
  if (driver != NULL) {
    dlclose(driver);
  }
  return value;
}

static gf_xpu_ze ze;

static void open_or_fail(void) {
  gf_error err = {0};
  if (gf_xpu_ze_open(loader, &ze, &err) != GF_OK) {
    fprintf(stderr, "opening Level Zero failed: %s\n", err.message);
    exit(1);
  }
}

static int discover(void) {
  open_or_fail();
  CHECK(ze.driver != NULL);
  CHECK(ze.device_count == 1);
  CHECK((unsigned)ze.api_version >= (unsigned)GF_XPU_MIN_API_VERSION);
  CHECK(ze.properties[0].type == ZE_DEVICE_TYPE_GPU);
  CHECK(strncmp(ze.properties[0].name, "graphed test GPU", 16) == 0);
  CHECK(ze.graph_flags[0] == GF_ZE_GRAPH_FLAG_IMMUTABLE);
  CHECK(ze.graph_extension == 1);
  CHECK(ze.graph_functions_found == GF_ZE_GRAPH_FUNCTION_COUNT);
  CHECK(ze.list_is_graph_capture_enabled != NULL);
  CHECK(gf_xpu_ze_device_index(&ze, ze.devices[0]) == 0);
  if (getenv("ZE_ENABLE_VALIDATION_LAYER") != NULL) {
    /* The validation layer is really in the path: it refuses a NULL descriptor that the test
     * driver would accept. */
    ze_context_handle_t context = NULL;
    CHECK(ze.api.ContextCreate(ze.driver, NULL, &context) == ZE_RESULT_ERROR_INVALID_NULL_POINTER);
  }
  char why[256] = "";
  CHECK(gf_xpu_ze_device_usable(&ze, 0, 0, why, sizeof why) == 1);
  CHECK(gf_xpu_ze_device_usable(&ze, 0, 1, why, sizeof why) == 1);
  CHECK(gf_xpu_ze_device_usable(&ze, 1, 0, why, sizeof why) == 0);
  CHECK(strstr(why, "xpu:1 does not exist") != NULL);
  /* The registry's probe: this build's torch has no XPU, so it refuses after finding the GPU. */
  const gf_backend *backend = gf_xpu_backend_probe(why, sizeof why);
  printf("probe: %s: %s\n", backend != NULL ? "accepted" : "refused", why);
#ifndef GF_XPU_WITH_TORCH
  CHECK(backend == NULL);
  CHECK(strstr(why, "finds 1 GPU device(s)") != NULL);
#endif
  return failures;
}

static int gather(void) {
  open_or_fail();
  long live_before = driver_counter("gf_test_driver_live_objects");
  gf_xpu_gather kernel;
  gf_xpu_gather_table table;
  gf_xpu_list list;
  CHECK_OK(gf_xpu_gather_create(&ze, NULL, ze.devices[0], &kernel, &check_err));
  CHECK(kernel.owns_context && kernel.module != NULL && kernel.kernel != NULL);
  CHECK_OK(gf_xpu_gather_table_create(&kernel, 8, &table, &check_err));
  CHECK_OK(gf_xpu_list_create(&kernel, &list, &check_err));

  /* Device buffers: the emulation's device memory is host memory. */
  unsigned char *src = NULL;
  unsigned char *dst = NULL;
  ze_device_mem_alloc_desc_t desc = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  CHECK(ze.api.MemAllocDevice(kernel.context, &desc, 4096, 64, ze.devices[0], (void **)&src) ==
        ZE_RESULT_SUCCESS);
  CHECK(ze.api.MemAllocDevice(kernel.context, &desc, 4096, 64, ze.devices[0], (void **)&dst) ==
        ZE_RESULT_SUCCESS);
  for (int i = 0; i < 4096; ++i) {
    src[i] = (unsigned char)(i * 7 + 1);
  }
  /* Aligned, unaligned and empty copies; the count never changes the number of submissions. */
  for (size_t count = 1; count <= 8; count += 3) {
    memset(dst, 0, 4096);
    gf_copy copies[8];
    for (size_t i = 0; i < count; ++i) {
      size_t offset = i * 400 + (i % 2); /* odd entries unaligned */
      copies[i] = (gf_copy){dst + offset, src + offset, i == 2 ? 0 : 100 + i * 16};
    }
    long before = driver_counter("gf_test_driver_submissions");
    CHECK_OK(gf_xpu_gather_submit(&kernel, &list, &table, copies, count, &check_err));
    CHECK(driver_counter("gf_test_driver_submissions") - before == 2);
    for (size_t i = 0; i < count; ++i) {
      const unsigned char *to = copies[i].dst;
      const unsigned char *from = copies[i].src;
      CHECK(memcmp(to, from, copies[i].bytes) == 0);
      CHECK(copies[i].bytes == 0 || to[copies[i].bytes] == 0); /* nothing past the end */
    }
    const gf_xpu_gather_entry *uploaded = table.device;
    CHECK(uploaded[count - 1].dst == (uint64_t)(uintptr_t)copies[count - 1].dst);
  }
  /* The table protocol's refusals: status codes, no submission. */
  gf_copy too_many[9] = {{0}};
  gf_error err = {0};
  long before = driver_counter("gf_test_driver_submissions");
  CHECK(gf_xpu_gather_submit(&kernel, &list, &table, too_many, 9, &err) == GF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "do not fit") != NULL);
  gf_copy missing = {NULL, src, 16};
  CHECK(gf_xpu_gather_submit(&kernel, &list, &table, &missing, 1, &err) == GF_ERR_INVALID_ARGUMENT);
  CHECK(gf_xpu_gather_submit(&kernel, &list, &table, NULL, 0, &err) == GF_OK);
  CHECK(driver_counter("gf_test_driver_submissions") == before);
  ze_group_count_t groups = gf_xpu_gather_groups(5);
  CHECK(groups.groupCountX == GF_XPU_GATHER_GROUPS_PER_COPY && groups.groupCountY == 5);

  /* Every handle released. */
  CHECK(ze.api.MemFree(kernel.context, src) == ZE_RESULT_SUCCESS);
  CHECK(ze.api.MemFree(kernel.context, dst) == ZE_RESULT_SUCCESS);
  gf_xpu_list_destroy(&list);
  gf_xpu_gather_table_destroy(&table);
  gf_xpu_gather_destroy(&kernel);
  long live_after = driver_counter("gf_test_driver_live_objects");
  printf("driver objects live: %ld before, %ld after\n", live_before, live_after);
  CHECK(live_before == 0 && live_after == 0);
  return failures;
}

/* Handle translation: the capture query is an extension call, which the loader does not unwrap. */
static int capture_query(void) {
  open_or_fail();
  gf_xpu_gather kernel;
  gf_xpu_list list;
  CHECK_OK(gf_xpu_gather_create(&ze, NULL, ze.devices[0], &kernel, &check_err));
  CHECK_OK(gf_xpu_list_create(&kernel, &list, &check_err));
  ze_result_t (*begin)(ze_command_list_handle_t, void *) = NULL;
  ze_result_t (*end)(ze_command_list_handle_t, void **, void *) = NULL;
  CHECK(ze.api.DriverGetExtensionFunctionAddress(ze.driver, "zeCommandListBeginGraphCaptureExp",
                                                 (void **)&begin) == ZE_RESULT_SUCCESS);
  CHECK(ze.api.DriverGetExtensionFunctionAddress(ze.driver, "zeCommandListEndGraphCaptureExp",
                                                 (void **)&end) == ZE_RESULT_SUCCESS);
  void *unknown = NULL;
  CHECK(ze.api.DriverGetExtensionFunctionAddress(ze.driver, "zeNoSuchFunctionExp", &unknown) !=
        ZE_RESULT_SUCCESS);
  void *translated = NULL;
  CHECK_OK(gf_xpu_ze_translate(&ze, ZEL_HANDLE_COMMAND_LIST, list.list, &translated, &check_err));
  int wrapped = translated != (void *)list.list;
  printf("loader wraps handles: %s\n", wrapped ? "yes" : "no");
  CHECK(wrapped == (getenv("ZE_ENABLE_LOADER_INTERCEPT") != NULL));
  if (wrapped) {
    /* Without translation the driver sees a handle that is not its own. */
    CHECK(ze.list_is_graph_capture_enabled(list.list) != GF_ZE_RESULT_QUERY_FALSE);
  }
  CHECK(gf_xpu_ze_list_capturing(&ze, list.list) == 0);
  CHECK(begin != NULL && begin((ze_command_list_handle_t)translated, NULL) == ZE_RESULT_SUCCESS);
  CHECK(gf_xpu_ze_list_capturing(&ze, list.list) == 1);
  CHECK(end != NULL && end((ze_command_list_handle_t)translated, NULL, NULL) == ZE_RESULT_SUCCESS);
  CHECK(gf_xpu_ze_list_capturing(&ze, list.list) == 0);
  gf_xpu_list_destroy(&list);
  gf_xpu_gather_destroy(&kernel);
  CHECK(driver_counter("gf_test_driver_live_objects") == 0);
  return failures;
}

/* A refusal by gf_xpu_ze_open whose sentence contains `expected`. */
static int refused(const char *expected) {
  gf_error err = {0};
  gf_status status = gf_xpu_ze_open(loader, &ze, &err);
  printf("refused: %s\n", err.message);
  CHECK(status != GF_OK);
  CHECK(strstr(err.message, expected) != NULL);
  char why[256] = "";
  CHECK(gf_xpu_backend_probe(why, sizeof why) == NULL);
  CHECK(strstr(why, expected) != NULL);
  return failures;
}

static int no_graph(void) {
  open_or_fail();
  char why[256] = "";
  CHECK(gf_xpu_ze_device_usable(&ze, 0, 0, why, sizeof why) == 1); /* SYCL-recorded graphs */
  CHECK(gf_xpu_ze_device_usable(&ze, 0, 1, why, sizeof why) == 0); /* native recording */
  printf("refused: %s\n", why);
  const char *expected = getenv("GF_TEST_ZE_GRAPH_EXTENSION") != NULL
                             ? "no record-and-replay graph extension"
                             : "reports no graph support";
  CHECK(strstr(why, expected) != NULL);
  return failures;
}

int main(int argc, char **argv) {
  const char *scenario = argc > 1 ? argv[1] : "";
  int result;
  if (strcmp(scenario, "discover") == 0) {
    result = discover();
  } else if (strcmp(scenario, "gather") == 0) {
    result = gather();
  } else if (strcmp(scenario, "capture_query") == 0) {
    result = capture_query();
  } else if (strcmp(scenario, "old_driver") == 0) {
    result = refused("reports API 1.2; graphed needs 1.3");
  } else if (strcmp(scenario, "no_device") == 0) {
    result = refused("reports no device");
  } else if (strcmp(scenario, "no_driver") == 0) {
    result = refused("found no GPU driver");
  } else if (strcmp(scenario, "no_graph") == 0) {
    result = no_graph();
  } else {
    fprintf(stderr, "unknown scenario '%s'\n", scenario);
    return 2;
  }
  printf("%s: %s\n", scenario, result == 0 ? "passed" : "FAILED");
  return result == 0 ? 0 : 1;
}
