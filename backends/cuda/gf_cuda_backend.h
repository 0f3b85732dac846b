/* The CUDA backend's entry for the backend registry (gf_backend_registry.h): everything else,
 * shared graph memory pools included, is reached through the table it returns. */
#ifndef GF_CUDA_BACKEND_H
#define GF_CUDA_BACKEND_H

#include "gf_backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA table when the CUDA driver library is installed; else NULL and why. It creates no
 * context, so a process that forks before touching CUDA is unaffected. */
const gf_backend *gf_cuda_backend_probe(char *why, size_t why_capacity);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_BACKEND_H */
