/* The Level Zero submission the XPU tests drive the gather kernel with (see gf_xpu_submit.h). */
#include "gf_xpu_submit.h"

#include <string.h>

int gf_xpu_ze_device_index(const gf_xpu_ze *ze, ze_device_handle_t device) {
  for (uint32_t i = 0; i < ze->device_count; ++i) {
    if (ze->devices[i] == device) {
      return (int)i;
    }
  }
  return -1;
}

ze_group_count_t gf_xpu_gather_groups(uint32_t count) {
  const gf_xpu_gather_launch launch = gf_xpu_gather_launch_of(count);
  ze_group_count_t groups = {launch.groups_per_copy, launch.copies, 1};
  return groups;
}

gf_status gf_xpu_gather_set_args(const gf_xpu_gather *gather, const void *device_table,
                                 uint32_t count, gf_error *err) {
  ze_result_t result =
      gather->ze->api.KernelSetArgumentValue(gather->kernel, 0, sizeof device_table, &device_table);
  if (result == ZE_RESULT_SUCCESS) {
    result = gather->ze->api.KernelSetArgumentValue(gather->kernel, 1, sizeof count, &count);
  }
  return result == ZE_RESULT_SUCCESS
             ? GF_OK
             : gf_xpu_ze_failed(err, "setting the copy kernel's arguments", result);
}

gf_status gf_xpu_gather_table_create(const gf_xpu_gather *gather, size_t capacity,
                                     gf_xpu_gather_table *table, gf_error *err) {
  memset(table, 0, sizeof *table);
  if (capacity == 0) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: a gather table needs entries");
  }
  const gf_xpu_ze_api *api = &gather->ze->api;
  size_t bytes = capacity * sizeof(gf_xpu_gather_entry);
  ze_host_mem_alloc_desc_t host_desc = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  void *host = NULL;
  ze_result_t result = api->MemAllocHost(gather->context, &host_desc, bytes, 64, &host);
  if (result != ZE_RESULT_SUCCESS) {
    return gf_xpu_ze_failed(err, "allocating the gather table's staging memory", result);
  }
  ze_device_mem_alloc_desc_t device_desc = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *device = NULL;
  result = api->MemAllocDevice(gather->context, &device_desc, bytes, 64, gather->device, &device);
  if (result != ZE_RESULT_SUCCESS) {
    api->MemFree(gather->context, host);
    return gf_xpu_ze_failed(err, "allocating the gather table in device memory", result);
  }
  table->gather = gather;
  table->host = host;
  table->device = device;
  table->capacity = capacity;
  return GF_OK;
}

void gf_xpu_gather_table_destroy(gf_xpu_gather_table *table) {
  if (table->gather == NULL) {
    return;
  }
  const gf_xpu_gather *gather = table->gather;
  gather->ze->api.MemFree(gather->context, table->device);
  gather->ze->api.MemFree(gather->context, table->host);
  memset(table, 0, sizeof *table);
}

gf_status gf_xpu_list_create(const gf_xpu_gather *gather, gf_xpu_list *list, gf_error *err) {
  memset(list, 0, sizeof *list);
  const gf_xpu_ze *ze = gather->ze;
  uint32_t ordinal = 0;
  uint32_t groups = 0;
  ze_command_queue_group_properties_t properties[64];
  if (ze->api.DeviceGetCommandQueueGroupProperties(gather->device, &groups, NULL) ==
          ZE_RESULT_SUCCESS &&
      groups > 0 && groups <= 64) {
    for (uint32_t g = 0; g < groups; ++g) {
      properties[g] = (ze_command_queue_group_properties_t){
          .stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES};
    }
    if (ze->api.DeviceGetCommandQueueGroupProperties(gather->device, &groups, properties) ==
        ZE_RESULT_SUCCESS) {
      for (uint32_t g = groups; g-- > 0;) {
        if (properties[g].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) {
          ordinal = g;
        }
      }
    }
  }
  /* flags 0: spec 1.4's validation layer refuses ZE_COMMAND_QUEUE_FLAG_IN_ORDER; the upload and
   * the launch are ordered by the event below instead. */
  ze_command_queue_desc_t queue_desc = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                        .ordinal = ordinal,
                                        .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                        .priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
  ze_result_t result =
      ze->api.CommandListCreateImmediate(gather->context, gather->device, &queue_desc, &list->list);
  if (result != ZE_RESULT_SUCCESS) {
    list->list = NULL;
    return gf_xpu_ze_failed(err, "creating an immediate command list", result);
  }
  list->gather = gather;
  ze_event_pool_desc_t pool_desc = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                                    .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                                    .count = 2};
  ze_device_handle_t device = gather->device;
  result = ze->api.EventPoolCreate(gather->context, &pool_desc, 1, &device, &list->pool);
  if (result != ZE_RESULT_SUCCESS) {
    list->pool = NULL;
    gf_xpu_list_destroy(list);
    return gf_xpu_ze_failed(err, "creating an event pool", result);
  }
  ze_event_handle_t *events[2] = {&list->uploaded, &list->done};
  for (uint32_t i = 0; i < 2; ++i) {
    ze_event_desc_t event_desc = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                                  .index = i,
                                  .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                                  .wait = ZE_EVENT_SCOPE_FLAG_HOST};
    result = ze->api.EventCreate(list->pool, &event_desc, events[i]);
    if (result != ZE_RESULT_SUCCESS) {
      *events[i] = NULL;
      gf_xpu_list_destroy(list);
      return gf_xpu_ze_failed(err, "creating an event", result);
    }
  }
  return GF_OK;
}

void gf_xpu_list_destroy(gf_xpu_list *list) {
  if (list->gather == NULL) {
    return;
  }
  const gf_xpu_ze_api *api = &list->gather->ze->api;
  if (list->done != NULL) {
    api->EventDestroy(list->done);
  }
  if (list->uploaded != NULL) {
    api->EventDestroy(list->uploaded);
  }
  if (list->pool != NULL) {
    api->EventPoolDestroy(list->pool);
  }
  if (list->list != NULL) {
    api->CommandListDestroy(list->list);
  }
  memset(list, 0, sizeof *list);
}

gf_status gf_xpu_gather_submit(const gf_xpu_gather *gather, gf_xpu_list *list,
                               gf_xpu_gather_table *table, const gf_copy *copies, size_t count,
                               gf_error *err) {
  if (count == 0) {
    return GF_OK;
  }
  if (count > UINT32_MAX) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: too many copies for one gather");
  }
  gf_status status = gf_xpu_gather_encode(copies, count, table->host, table->capacity, err);
  if (status == GF_OK) {
    status = gf_xpu_gather_set_args(gather, table->device, (uint32_t)count, err);
  }
  if (status != GF_OK) {
    return status;
  }
  const gf_xpu_ze_api *api = &gather->ze->api;
  /* Submission 1: the table upload, signalling `uploaded`, which the launch waits on. */
  ze_result_t result = api->CommandListAppendMemoryCopy(list->list, table->device, table->host,
                                                        count * sizeof(gf_xpu_gather_entry),
                                                        list->uploaded, 0, NULL);
  if (result != ZE_RESULT_SUCCESS) {
    return gf_xpu_ze_failed(err, "uploading the gather table", result);
  }
  /* Submission 2: the gather itself, signalling `done`. */
  ze_group_count_t groups = gf_xpu_gather_groups((uint32_t)count);
  ze_event_handle_t uploaded = list->uploaded;
  result = api->CommandListAppendLaunchKernel(list->list, gather->kernel, &groups, list->done, 1,
                                              &uploaded);
  ze_event_handle_t last = result == ZE_RESULT_SUCCESS ? list->done : list->uploaded;
  ze_result_t waited = api->EventHostSynchronize(last, UINT64_MAX);
  api->EventHostReset(list->uploaded);
  api->EventHostReset(list->done);
  if (result != ZE_RESULT_SUCCESS) {
    return gf_xpu_ze_failed(err, "launching the gather", result);
  }
  return waited == ZE_RESULT_SUCCESS ? GF_OK
                                     : gf_xpu_ze_failed(err, "waiting for the gather", waited);
}
