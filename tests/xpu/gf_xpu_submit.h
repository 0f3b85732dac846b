/* The Level Zero submission of the gather kernel that only the tests use: production submits
 * through SYCL on torch's queue (backends/xpu/gf_xpu_torch.cpp). With it, tests/xpu runs the
 * backend's kernel, table encoding and launch shape through the real loader and the test driver
 * without torch: a table pair, an immediate command list with its two events, and the two
 * submissions of the table protocol. Every handle created here has one function that releases
 * it. */
#ifndef GF_XPU_SUBMIT_H
#define GF_XPU_SUBMIT_H

#include "gf_xpu_level_zero.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The index of `device` among ze->devices, or -1. */
int gf_xpu_ze_device_index(const gf_xpu_ze *ze, ze_device_handle_t device);

/* The Level Zero group count of a launch over `count` entries (gf_xpu_gather_launch_of). */
ze_group_count_t gf_xpu_gather_groups(uint32_t count);

/* Sets the kernel's arguments: the device table and the entry count. */
gf_status gf_xpu_gather_set_args(const gf_xpu_gather *gather, const void *device_table,
                                 uint32_t count, gf_error *err);

/* A table pair: host staging and device memory of `capacity` entries. */
typedef struct gf_xpu_gather_table {
  const gf_xpu_gather *gather;
  gf_xpu_gather_entry *host;
  void *device;
  size_t capacity;
} gf_xpu_gather_table;

gf_status gf_xpu_gather_table_create(const gf_xpu_gather *gather, size_t capacity,
                                     gf_xpu_gather_table *table, gf_error *err);
void gf_xpu_gather_table_destroy(gf_xpu_gather_table *table);

/* An immediate command list on the gather's device, with the two events that order a gather's
 * upload before its launch and let the host wait for the launch. */
typedef struct gf_xpu_list {
  const gf_xpu_gather *gather;
  ze_command_list_handle_t list;
  ze_event_pool_handle_t pool;
  ze_event_handle_t uploaded;
  ze_event_handle_t done;
} gf_xpu_list;

gf_status gf_xpu_list_create(const gf_xpu_gather *gather, gf_xpu_list *list, gf_error *err);
void gf_xpu_list_destroy(gf_xpu_list *list);

/* The table protocol on a Level Zero list: encode the copies into the host staging, then two
 * submissions whatever the count (the staging-to-device table upload and the kernel launch, which
 * waits on it), then the host waits for the launch, so the staging may be rewritten. */
gf_status gf_xpu_gather_submit(const gf_xpu_gather *gather, gf_xpu_list *list,
                               gf_xpu_gather_table *table, const gf_copy *copies, size_t count,
                               gf_error *err);

#ifdef __cplusplus
}
#endif

#endif /* GF_XPU_SUBMIT_H */
