/* The backend of a machine with no graph-capable device: it supports nothing, so every runner is
 * disabled with the reason it carries (set by the load-time choice), and every call runs eager.
 * Its table is self-contained: the reason is its context, and since graphs_supported always
 * refuses, no device hook is ever called and none is filled in. */
#include "gf_backend_registry.h"

#include <stdio.h>

enum { GF_NONE_REASON_CAPACITY = 1024 };

static char gf_none_reason[GF_NONE_REASON_CAPACITY] = "no device backend was chosen";

static int gf_none_graphs_supported(void *context, int device_type, int device_index, char *why,
                                    size_t why_capacity) {
  (void)device_type;
  (void)device_index;
  snprintf(why, why_capacity, "%s", (const char *)context);
  return 0;
}

static const gf_backend gf_none_backend = {
    .name = "none",
    .context = gf_none_reason,
    .graphs_supported = gf_none_graphs_supported,
};

const gf_backend *gf_backend_none(void) { return &gf_none_backend; }

void gf_backend_none_set_reason(const char *reason) {
  snprintf(gf_none_reason, sizeof gf_none_reason, "%s", reason != NULL ? reason : "");
}
