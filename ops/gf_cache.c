/* The signature cache (see gf_cache.h): chained buckets indexed by the signature's hash, and a
 * doubly linked list from newest to oldest use for LRU eviction. */
#include "gf_cache.h"

#include <stdlib.h>

static size_t gf_cache_bucket_of(const gf_cache *cache, uint64_t hash) {
  return (size_t)(hash & (uint64_t)(cache->bucket_count - 1));
}

static gf_status gf_cache_alloc_buckets(gf_cache *cache, size_t bucket_count, gf_error *err) {
  gf_entry **buckets = calloc(bucket_count, sizeof *buckets);
  if (buckets == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for the signature cache");
  }
  gf_entry **old = cache->buckets;
  size_t old_count = cache->bucket_count;
  cache->buckets = buckets;
  cache->bucket_count = bucket_count;
  for (size_t b = 0; b < old_count; ++b) {
    gf_entry *entry = old[b];
    while (entry != NULL) {
      gf_entry *next = entry->bucket_next;
      size_t slot = gf_cache_bucket_of(cache, entry->signature.hash);
      entry->bucket_next = buckets[slot];
      buckets[slot] = entry;
      entry = next;
    }
  }
  free(old);
  return GF_OK;
}

gf_status gf_cache_init(gf_cache *cache, size_t max_entries, gf_entry_release_fn release,
                        void *release_context, gf_error *err) {
  if (max_entries == 0) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                        "graphed: max_entries must be at least 1, got 0");
  }
  *cache = (gf_cache){0};
  cache->max_entries = max_entries;
  cache->release = release;
  cache->release_context = release_context;
  /* Twice max_entries, up to a bound: a huge max_entries (sys.maxsize) must neither overflow
   * nor allocate up front; inserts grow the table as entries arrive. */
  size_t bucket_count = 16;
  while (bucket_count < GF_CACHE_INITIAL_BUCKETS_MAX && bucket_count / 2 < max_entries) {
    bucket_count *= 2;
  }
  return gf_cache_alloc_buckets(cache, bucket_count, err);
}

static void gf_lru_unlink(gf_cache *cache, gf_entry *entry) {
  if (entry->lru_newer != NULL) {
    entry->lru_newer->lru_older = entry->lru_older;
  } else {
    cache->newest = entry->lru_older;
  }
  if (entry->lru_older != NULL) {
    entry->lru_older->lru_newer = entry->lru_newer;
  } else {
    cache->oldest = entry->lru_newer;
  }
  entry->lru_newer = entry->lru_older = NULL;
}

static void gf_lru_push_newest(gf_cache *cache, gf_entry *entry) {
  entry->lru_newer = NULL;
  entry->lru_older = cache->newest;
  if (cache->newest != NULL) {
    cache->newest->lru_newer = entry;
  }
  cache->newest = entry;
  if (cache->oldest == NULL) {
    cache->oldest = entry;
  }
}

gf_entry *gf_cache_find(const gf_cache *cache, const gf_signature *sig) {
  gf_entry *entry = cache->buckets[gf_cache_bucket_of(cache, sig->hash)];
  while (entry != NULL && !gf_signature_equal(&entry->signature, sig)) {
    entry = entry->bucket_next;
  }
  return entry;
}

gf_entry *gf_cache_lookup(gf_cache *cache, const gf_signature *sig) {
  gf_entry *entry = gf_cache_find(cache, sig);
  if (entry != NULL && cache->newest != entry) {
    gf_lru_unlink(cache, entry);
    gf_lru_push_newest(cache, entry);
  }
  return entry;
}

static void gf_bucket_unlink(gf_cache *cache, gf_entry *entry) {
  gf_entry **link = &cache->buckets[gf_cache_bucket_of(cache, entry->signature.hash)];
  while (*link != NULL && *link != entry) {
    link = &(*link)->bucket_next;
  }
  if (*link == entry) {
    *link = entry->bucket_next;
  }
  entry->bucket_next = NULL;
}

void gf_cache_remove(gf_cache *cache, gf_entry *entry) {
  gf_bucket_unlink(cache, entry);
  gf_lru_unlink(cache, entry);
  cache->count--;
  if (entry->pinned) {
    cache->pinned_count--;
  }
  if (cache->release != NULL) {
    cache->release(cache->release_context, entry);
  }
  gf_entry_destroy(entry);
}

void gf_cache_make_room(gf_cache *cache, int *grew_past_limit) {
  *grew_past_limit = 0;
  while (cache->count >= cache->max_entries) {
    gf_entry *victim = cache->oldest;
    while (victim != NULL && victim->pinned) {
      victim = victim->lru_newer;
    }
    if (victim == NULL) {
      if (!cache->warned_pinned_growth) {
        cache->warned_pinned_growth = 1;
        *grew_past_limit = 1;
      }
      return;
    }
    gf_cache_remove(cache, victim);
    cache->evictions++;
  }
}

gf_status gf_cache_insert(gf_cache *cache, gf_entry *entry, gf_error *err) {
  if (cache->count + 1 > cache->bucket_count) {
    gf_status status = gf_cache_alloc_buckets(cache, 2 * cache->bucket_count, err);
    if (status != GF_OK) {
      return status;
    }
  }
  size_t slot = gf_cache_bucket_of(cache, entry->signature.hash);
  entry->bucket_next = cache->buckets[slot];
  cache->buckets[slot] = entry;
  gf_lru_push_newest(cache, entry);
  cache->count++;
  if (entry->pinned) {
    cache->pinned_count++;
  }
  return GF_OK;
}

void gf_cache_clear(gf_cache *cache) {
  while (cache->newest != NULL) {
    gf_cache_remove(cache, cache->newest);
  }
}

void gf_cache_destroy(gf_cache *cache) {
  gf_cache_clear(cache);
  free(cache->buckets);
  cache->buckets = NULL;
  cache->bucket_count = 0;
}

gf_entry *gf_entry_create(const gf_signature *sig, int pinned, gf_error *err) {
  gf_entry *entry = calloc(1, sizeof *entry);
  if (entry == NULL) {
    gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a cache entry");
    return NULL;
  }
  if (gf_signature_copy(&entry->signature, sig, err) != GF_OK) {
    free(entry);
    return NULL;
  }
  entry->pinned = pinned ? 1 : 0;
  entry->device_bytes = -1;
  entry->reserved_bytes = -1;
  return entry;
}

void gf_entry_destroy(gf_entry *entry) {
  gf_signature_free(&entry->signature);
  free(entry->mutated_inputs);
  gf_pool_free(&entry->static_inputs, NULL, NULL);
  gf_pool_free(&entry->static_outputs, NULL, NULL);
  gf_pool_free(&entry->keep_alive, NULL, NULL);
  free(entry);
}
