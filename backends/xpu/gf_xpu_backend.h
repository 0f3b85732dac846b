/* The Level Zero (Intel GPU) backend's entry for the backend registry (gf_backend_registry.h). */
#ifndef GF_XPU_BACKEND_H
#define GF_XPU_BACKEND_H

#include "gf_backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The Level Zero table when the loader opens, a GPU driver of API 1.3 or later answers with a
 * device, and this build has the torch half; else NULL and why. */
const gf_backend *gf_xpu_backend_probe(char *why, size_t why_capacity);

#ifdef __cplusplus
}
#endif

#endif /* GF_XPU_BACKEND_H */
