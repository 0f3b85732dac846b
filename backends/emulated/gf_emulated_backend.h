/* The emulated backend: a host-memory stand-in for a device, for tests of the capture protocol,
 * agreement and the cache on machines with no GPU. It captures nothing: its "graph" is a token
 * and its launch does no work, so replays return what the capture-time forward wrote. Its copies
 * are real memcpy's over host memory. The failing variant fails every capture, as a synchronizing
 * operator or a broken driver would, so one rank of a group can be made to fail. */
#ifndef GF_EMULATED_BACKEND_H
#define GF_EMULATED_BACKEND_H

#include "gf_backend.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Probes for the backend registry (by name only: never chosen at load): "emulated" and
 * "emulated_fail_capture" always answer with their tables. */
const gf_backend *gf_emulated_backend_probe(char *why, size_t why_capacity);
const gf_backend *gf_emulated_failing_backend_probe(char *why, size_t why_capacity);

#ifdef __cplusplus
}
#endif

#endif /* GF_EMULATED_BACKEND_H */
