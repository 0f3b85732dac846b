/* The CUDA backend's entry for the backend registry (gf_backend_registry.h), and its shared graph
 * memory pools (graphed.MemoryPool), which the shim asks for by device. */
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

/* A table whose runners share one graph memory pool on device_index (-1: the current device):
 * pass it to gf_runner_create. Release it when no more runners will be made on it; the pool lives
 * until its last runner is destroyed too. */
gf_status gf_cuda_backend_with_pool(int device_index, const gf_backend **table, gf_error *err);
void gf_cuda_backend_release_pool(const gf_backend *table);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_BACKEND_H */
