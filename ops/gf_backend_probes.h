/* The probes that each compiled-in backend offers to the load-time choice. A probe returns its
 * backend when the platform is present, else NULL and a sentence in why. */
#ifndef GF_BACKEND_PROBES_H
#define GF_BACKEND_PROBES_H

#include "gf_backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

const gf_backend *gf_cuda_backend_probe(char *why, size_t why_capacity);
const gf_backend *gf_xpu_backend_probe(char *why, size_t why_capacity);

#ifdef __cplusplus
}
#endif

#endif /* GF_BACKEND_PROBES_H */
