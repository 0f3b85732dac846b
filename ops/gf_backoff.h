/* Keys held back after running out of device memory: a capture (its warm-ups, its static buffers,
 * its graph) that ran out of device memory would run out again on the next call of the same key,
 * and each attempt costs the forwards before it. The runner remembers the last GF_BACKOFF_KEYS
 * such keys by hash and runs them eager for a back-off counted in calls of the runner (64, doubled
 * at each failure of the same key, at most 4096), or until memory may have been freed: an entry
 * evicted, or reset(). */
#ifndef GF_BACKOFF_H
#define GF_BACKOFF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  GF_BACKOFF_KEYS = 8,
  GF_BACKOFF_FIRST = 64,  /* calls a key is held back after its first failure */
  GF_BACKOFF_MOST = 4096, /* the longest back-off */
};

typedef struct gf_backoff {
  uint64_t hash[GF_BACKOFF_KEYS];  /* 0: an empty slot */
  uint64_t until[GF_BACKOFF_KEYS]; /* the call count from which the key may capture again */
  uint64_t length[GF_BACKOFF_KEYS];
  size_t next;
  uint64_t evictions; /* the runner's evictions when the latest key was held back */
} gf_backoff;

/* Whether the key `hash` is held back at call count `now`; `evictions` is the runner's count (an
 * eviction since the latest failure frees memory: every key may try again). */
int gf_backoff_holds(gf_backoff *backoff, uint64_t hash, uint64_t now, uint64_t evictions);

/* The key `hash` ran out of device memory at call count `now`; returns the calls it is held back.
 */
uint64_t gf_backoff_hold(gf_backoff *backoff, uint64_t hash, uint64_t now, uint64_t evictions);

/* Forgets every key (reset()). */
void gf_backoff_clear(gf_backoff *backoff);

#ifdef __cplusplus
}
#endif

#endif /* GF_BACKOFF_H */
