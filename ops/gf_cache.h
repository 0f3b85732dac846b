/* The signature cache: a hash map from signature to entry with LRU order and a max_entries limit.
 * Pinned entries are never evicted; when every resident entry is pinned the cache grows past its
 * limit and reports that once, so the runner can warn once. Entries are owned by the cache and
 * given back through the release callback when evicted or cleared. */
#ifndef GF_CACHE_H
#define GF_CACHE_H

#include "gf_pool.h"
#include "gf_signature.h"
#include "gf_status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most buckets gf_cache_init makes up front; more come as entries are inserted. */
enum { GF_CACHE_INITIAL_BUCKETS_MAX = 4096 };

/* Whether an entry's static inputs may be shared with the other entries of its runner (see
 * gf_runner_share_static_inputs in gf_capture.c). Known only from a warm-up; a zeroed entry does
 * not know yet, and so shares nothing. */
typedef enum gf_input_sharing {
  GF_INPUTS_ALIASED = -1, /* a warm-up returned an output aliasing an input: it lends and borrows
                           * nothing, so that its static outputs survive other entries' replays */
  GF_INPUTS_UNKNOWN = 0,  /* no warm-up ran (yet) */
  GF_INPUTS_SHAREABLE = 1 /* its warm-ups returned no output aliasing an input */
} gf_input_sharing;

typedef struct gf_entry {
  gf_signature signature;
  int pinned;
  int folded; /* the graph holds the input and output copy nodes (see gf_backend.h) */
  uint64_t replays;
  void *graph;            /* the backend's graph, NULL until captured */
  gf_pool static_inputs;  /* contiguous copies the graph reads */
  gf_pool static_outputs; /* the tensors the graph writes */
  gf_pool keep_alive;     /* tensors outside the kwargs the forward reads */
  size_t *mutated_inputs; /* indices of the inputs the forward writes in place, ascending */
  size_t mutated_count;   /* replays write those back to the caller's tensors */
  int64_t device_bytes;   /* device memory the capture took (-1: unknown) */
  int64_t reserved_bytes; /* device memory the capture added to the allocator's (-1: unknown) */
  double capture_seconds; /* how long its capture took, warm-ups and probe included */
  gf_input_sharing inputs_shareable;
  void *user; /* the host's own data for the entry (NULL: none), released with the entry through
               * gf_host.release_user; the CPython entry keeps the entry's output template here */
  void *inventory;  /* what its capture reads besides its pools (gf_forward_report.inventory), or
                     * NULL; released with the entry through gf_host.release_inventory */
  size_t externals; /* how many tensors the inventory watches */
  size_t staged;    /* how many host constants its capture staged */
  struct gf_entry *lru_newer;
  struct gf_entry *lru_older;
  struct gf_entry *bucket_next;
} gf_entry;

typedef void (*gf_entry_release_fn)(void *context, gf_entry *entry);

typedef struct gf_cache {
  gf_entry **buckets;
  size_t bucket_count; /* a power of two */
  size_t count;
  size_t pinned_count;
  size_t max_entries;
  gf_entry *newest;
  gf_entry *oldest;
  gf_hash_fn hash_fn; /* NULL: gf_signature_default_hash */
  gf_entry_release_fn release;
  void *release_context;
  uint64_t evictions;
  int warned_pinned_growth;
} gf_cache;

gf_status gf_cache_init(gf_cache *cache, size_t max_entries, gf_entry_release_fn release,
                        void *release_context, gf_error *err);

/* The entry with this signature, made the most recently used; NULL when absent. */
gf_entry *gf_cache_lookup(gf_cache *cache, const gf_signature *sig);

/* The entry with this signature without touching the LRU order; NULL when absent. */
gf_entry *gf_cache_find(const gf_cache *cache, const gf_signature *sig);

/* Evicts least recently used unpinned entries until one more fits under max_entries. Sets
 * *grew_past_limit to 1 the first time the cache must exceed its limit because every resident
 * entry is pinned (0 otherwise). */
void gf_cache_make_room(gf_cache *cache, int *grew_past_limit);

/* Inserts an entry allocated by gf_entry_create (its signature must be absent); the cache owns it
 * from now on. Call gf_cache_make_room first to respect max_entries. */
gf_status gf_cache_insert(gf_cache *cache, gf_entry *entry, gf_error *err);

/* Unlinks and releases one entry. */
void gf_cache_remove(gf_cache *cache, gf_entry *entry);

/* Releases every entry; the cache stays usable. */
void gf_cache_clear(gf_cache *cache);

/* Clears and frees the cache's own storage. */
void gf_cache_destroy(gf_cache *cache);

/* A zeroed entry holding a copy of sig. */
gf_entry *gf_entry_create(const gf_signature *sig, int pinned, gf_error *err);

/* Frees the entry's own storage (its pools and user data must already be released). */
void gf_entry_destroy(gf_entry *entry);

#ifdef __cplusplus
}
#endif

#endif /* GF_CACHE_H */
