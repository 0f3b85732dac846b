/* The host is the framework side of a runner: it owns tensors (clone, allocate, release), calls the
 * forward to capture through the dispatcher, and agrees across the process group. The shim fills
 * it from libtorch; the core tests fill it with plain malloc'd buffers. `context` is per runner. */
#ifndef GF_HOST_H
#define GF_HOST_H

#include "gf_pool.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gf_host {
  void *context;
  /* A fresh contiguous tensor holding a copy of live (its handle owned by the caller). */
  gf_status (*clone_static)(void *context, const gf_tensor *live, gf_tensor *out, gf_error *err);
  /* A fresh contiguous uninitialised tensor shaped like `like` (its handle owned by the caller). */
  gf_status (*empty_like)(void *context, const gf_tensor *like, gf_tensor *out, gf_error *err);
  /* A new owning handle to the same tensor. */
  gf_status (*retain)(void *context, const gf_tensor *tensor, gf_tensor *out, gf_error *err);
  /* Runs the forward once on inputs, appending its outputs (owned handles) to outputs. */
  gf_status (*run_forward)(void *context, const gf_tensor *inputs, size_t count, gf_pool *outputs,
                           gf_error *err);
  /* The MIN of ok over the process group (ok itself without a group); negative on failure. */
  int (*agree)(void *context, int ok);
  void (*release)(void *context, void *handle);
  void (*warn)(void *context, const char *message);
  /* Called when the runner is destroyed: frees context. May be NULL. */
  void (*destroy)(void *context);
} gf_host;

#ifdef __cplusplus
}
#endif

#endif /* GF_HOST_H */
