/* The emulated backend, the one backend of the test plugin libgraphed_testing.so: a host-memory
 * stand-in for a device, for tests of the capture protocol, agreement and the cache on machines
 * with no GPU. It captures nothing: its "graph" is a token and its launch does no work, so replays
 * return what the capture-time forward wrote. Its copies are real memcpy's over host memory.
 *
 * It is not part of the product: the plugin is built with the GoogleTest suites and never
 * installed. Loading it (dlopen, ctypes.CDLL or torch.ops.load_library, after graphed's library)
 * registers "emulated" into the backend registry that library exports, by name only (never chosen
 * at load); a runner gets it by naming it (create(..., backend="emulated")). */
#ifndef GF_EMULATED_BACKEND_H
#define GF_EMULATED_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

/* The fault switch: while `fail` is non-zero every capture_end fails ("graphed: emulated capture
 * failure"), as a synchronizing operator or a broken driver would, so that one rank of a group
 * can be made to fail. Process-wide; tests set it around the runners they create and reset it. */
void gf_emulated_fail_captures(int fail);

/* The hand-over switch: while `hand_over` is non-zero the first call of a key may be answered from
 * its last warm-up (Note [The first call from its last warm-up], ops/gf_warm_up_answer.c), as on a
 * CUDA device; off (the default) it replays, so that the replay counts the tests assert keep their
 * meaning. Process-wide, as the fault switch. */
void gf_emulated_hand_over_warm_ups(int hand_over);

#ifdef __cplusplus
}
#endif

#endif /* GF_EMULATED_BACKEND_H */
