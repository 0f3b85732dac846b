/* The emulated backend: a host-memory stand-in for a device, for tests of the capture protocol,
 * agreement and the cache on machines with no GPU. It captures nothing: its "graph" is a token
 * and its launch does no work, so replays return what the capture-time forward wrote. Its copies
 * are real memcpy's over host memory. The failing variant fails every capture, as a synchronizing
 * operator or a broken driver would, so one rank of a group can be made to fail. */
#ifndef GF_EMULATED_BACKEND_H
#define GF_EMULATED_BACKEND_H

#include "gf_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

const gf_backend *gf_emulated_backend(int fail_capture);

#ifdef __cplusplus
}
#endif

#endif /* GF_EMULATED_BACKEND_H */
