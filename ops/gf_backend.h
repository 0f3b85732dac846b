/* A backend is a table of device hooks. Keying, pools, replay order, LRU and agreement live once
 * in the core; a backend only knows how to stream, capture, copy and launch on its device. The
 * layer above registers each backend it was built with (gf_backend_registry.h) when the library
 * loads, or a test plugin when a test loads it; the core never names one. Every hook returns a
 * status; none may abort. `state` is the per-runner object made by runner_create (streams, the
 * graph pool).
 *
 * Required of a backend that can capture: name, graphs_supported, capture_end, copy_batch and
 * launch. Every other hook is optional, as c10's DeviceGuardImplInterface methods are: left NULL,
 * it has the default its comment names, so a backend writes no stub. */
#ifndef GF_BACKEND_H
#define GF_BACKEND_H

#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy of a batch: `bytes` contiguous bytes from src to dst, both on the runner's device. */
typedef struct gf_copy {
  void *dst;
  const void *src;
  size_t bytes;
} gf_copy;

typedef struct gf_backend {
  const char *name; /* the name it is registered and reported under */
  void *context;    /* the backend's own data, passed to every hook */

  /* 1 when graphs can be captured on this device (device_type/index as in gf_tensor); else 0 and
   * a sentence in why. */
  int (*graphs_supported)(void *context, int device_type, int device_index, char *why,
                          size_t why_capacity);
  /* Optional (default: no state, and nothing to destroy). pool: NULL for a graph memory pool of
   * the runner's own, else a pool this backend's pool_create made on the runner's device (the
   * caller checks the device), whose memory the runner's graphs then share with every other
   * runner made on it; the state takes its own reference to it where it keeps it. */
  gf_status (*runner_create)(void *context, int device_index, void *pool, void **state,
                             gf_error *err);
  void (*runner_destroy)(void *context, void *state);

  /* (Note [Memory pools], backends/cuda/gf_cuda_torch_internal.h, tells the CUDA pool's life.)
   * A graph memory pool several runners share (graphed.MemoryPool), so that they reserve about
   * what the largest of them needs rather than the sum. pool_create makes one on the device
   * (device_type/index as in gf_tensor, -1: the current device) holding one reference, or leaves
   * *pool NULL where the backend has no pools on that device; pool_release drops that reference,
   * and the runners made on the pool keep theirs. Optional, both or neither (default: no pools to
   * share; a pool of the layer above then only groups its runners, each with memory of its own). */
  gf_status (*pool_create)(void *context, int device_type, int device_index, void **pool,
                           gf_error *err);
  void (*pool_release)(void *context, void *pool);

  /* Optional (default: never). 1 when the current stream is being captured by someone else:
   * calls then run eager. */
  int (*outer_capture_active)(void *context, void *state);

  /* Sync-debug mode "warn" on / back to what it was, around the first validated forward: each
   * synchronizing operator is counted, not raised, so the forward runs to its end on every rank;
   * end fails, saying how many, when there were any. Optional (default: nothing to switch, as on a
   * device with no sync-debug mode; a synchronising forward is then caught only if its capture
   * fails). */
  gf_status (*sync_probe_begin)(void *context, void *state, gf_error *err);
  gf_status (*sync_probe_end)(void *context, void *state, gf_error *err);

  /* Make a side stream that waits on the current one current / join it back. Optional (default:
   * the warm-ups run on the current stream). */
  gf_status (*warmup_begin)(void *context, void *state, gf_error *err);
  gf_status (*warmup_end)(void *context, void *state, gf_error *err);

  /* Between warmup_begin and warmup_end: make the caller's stream (current before warmup_begin)
   * current again, waiting for the warm-ups' work, and stop routing its allocations, so that the
   * copies handed to the caller are made there, in memory of the caller's own / go back to the
   * side stream, which waits for those copies before it frees what they read. The first call of a
   * key is then answered from its last warm-up (Note [The first call from its last warm-up],
   * gf_warm_up_answer.c). begin returns GF_ERR_NOT_FOUND, having changed nothing, where it cannot
   * now; end is called after every begin that returned GF_OK. Optional, both or neither (default:
   * the first call of a key replays its new graph). */
  gf_status (*caller_stream_begin)(void *context, void *state, gf_error *err);
  gf_status (*caller_stream_end)(void *context, void *state, gf_error *err);

  /* Capture everything launched between begin and end into a graph that allocates from the
   * runner's one pool. end must be called after a successful begin, also when the forward failed
   * (ok = 0), and then returns no graph. capture_begin is optional (default: nothing to start:
   * capture_end alone makes the graph). */
  gf_status (*capture_begin)(void *context, void *state, gf_error *err);
  gf_status (*capture_end)(void *context, void *state, int ok, void **graph, gf_error *err);

  /* All copies in a constant number of device launches on the current stream. */
  gf_status (*copy_batch)(void *context, void *state, const gf_copy *copies, size_t count,
                          gf_error *err);
  gf_status (*launch)(void *context, void *state, void *graph, gf_error *err);
  void (*release_graph)(void *context, void *state, void *graph); /* optional: nothing to free */

  /* Optional (default: no folding): folding the copies into the graph, so a replay is one launch
   * whatever the number of tensors. capture_copy_node records, into the capture in progress, a
   * batched copy node of `role` (GF_COPY_INPUTS before the forward, GF_COPY_OUTPUTS after it) and
   * sets *recorded to 1; *recorded stays 0 when it cannot (too many tensors), and the replay then
   * uses copy_batch. launch_folded rewrites both nodes' tables and launches the graph; it returns
   * GF_ERR_NOT_FOUND, having launched nothing, when the graph has no such nodes. */
  gf_status (*capture_copy_node)(void *context, void *state, int role, const gf_copy *copies,
                                 size_t count, int *recorded, gf_error *err);
  gf_status (*launch_folded)(void *context, void *state, void *graph, const gf_copy *inputs,
                             size_t input_count, const gf_copy *outputs, size_t output_count,
                             gf_error *err);

  /* Optional: device memory in use on the runner's device now (bytes), so the runner can say
   * what a capture took; -1 when unknown. */
  int64_t (*device_bytes_in_use)(void *context, void *state);
  /* Optional: device memory the allocator holds on the runner's device now, every pool counted
   * (bytes; -1 when unknown), so that a capture can say what it added; and what the runner's graph
   * pool holds of it (shared by the runners of one pool), for stats, where state is NULL when the
   * runner's device has no graphs (runner_create was not called). */
  int64_t (*device_bytes_reserved)(void *context, void *state);
  int64_t (*pool_bytes_reserved)(void *context, void *state);

  /* Optional (default: nothing is held beyond the attempt's own buffers, which the runner has
   * released). Called after a capture ran out of device memory, its entry released, before the
   * eager run that answers the call: give back to the device what the runner's graph pool keeps
   * cached for no graph (the memory the attempt's warm-ups and capture took), so that the eager
   * run can have it. Best effort, never fails; a pool that holds graphs keeps its memory, which is
   * theirs. */
  void (*give_back_memory)(void *context, void *state);
  /* Optional (default: GF_ERR_NOT_FOUND, nothing queued: the layer above compares another way).
   * Verify mode's comparison of a sampled call (graphed._verify): queues on the current stream,
   * behind the work that wrote them, a bitwise comparison of `count` pairs of byte ranges (each
   * gf_copy's dst with its src, `bytes` long, on the runner's device) and does not wait; once it
   * has run, the device has written 0 (every pair equal) or 1 (some byte differs) to `verdict`, a
   * byte of pinned host memory. `scratch`: two 32-bit words of device memory, zero, that this
   * comparison alone uses until it has run, and leaves zero. GF_ERR_NOT_FOUND too, having queued
   * nothing, where the device cannot write `verdict`. */
  gf_status (*compare_later)(void *context, void *state, const gf_copy *pairs, size_t count,
                             uint8_t *verdict, uint32_t *scratch, gf_error *err);
} gf_backend;

enum { GF_COPY_INPUTS = 0, GF_COPY_OUTPUTS = 1 };

#ifdef __cplusplus
}
#endif

#endif /* GF_BACKEND_H */
