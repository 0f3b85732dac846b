/* Why this exists: a libFuzzer target over the parts of the C core that take bytes and sizes from
 * callers (the signature, the cache and the pools), so that address and undefined-behaviour
 * sanitizers see them fed arbitrary keys, shapes and operation orders, not only the cases the
 * GoogleTests chose. Built and run by scripts/sanitize.sh (clang -fsanitize=fuzzer,address,
 * undefined); its seed corpus is tests/fuzz/corpus/.
 *
 * The input is a little program: each operation byte picks build+insert, lookup, find, remove,
 * clear or a pool round trip, and takes its operands (key bytes, tensor count, dtypes, sizes,
 * pin flag) from the bytes that follow. A model of what the cache must hold (at most one entry
 * per signature, lookups find what was inserted and not removed) is checked as it runs. */
#include "gf_cache.h"
#include "gf_pool.h"
#include "gf_signature.h"
#include "gf_tensor.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
  const uint8_t *at;
  size_t left;
} reader;

static uint8_t take_byte(reader *r) {
  if (r->left == 0) {
    return 0;
  }
  r->left--;
  return *r->at++;
}

static int64_t take_size(reader *r) {
  /* Mostly small sizes, sometimes extreme ones (negative, huge), which the core must survive. */
  uint8_t kind = take_byte(r);
  if (kind < 200) {
    return kind % 9;
  }
  int64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value = (int64_t)((uint64_t)value << 8 | take_byte(r));
  }
  return value;
}

/* Fills tensors from the input; the count may exceed GF_MAX_DIMS in ndim, which the signature
 * must refuse. Returns the tensor count. */
static size_t take_tensors(reader *r, gf_tensor *tensors, size_t capacity) {
  size_t count = take_byte(r) % (capacity + 1);
  for (size_t i = 0; i < count; ++i) {
    gf_tensor *t = &tensors[i];
    memset(t, 0, sizeof *t);
    t->dtype = take_byte(r) % 8;
    t->itemsize = 1 << (take_byte(r) % 4);
    t->device_type = take_byte(r) % 3;
    t->device_index = (int32_t)(take_byte(r) % 3) - 1;
    t->ndim = (int32_t)(take_byte(r) % (GF_MAX_DIMS + 3)) - 1; /* -1 .. GF_MAX_DIMS + 1 */
    int32_t stored = t->ndim < 0 ? 0 : t->ndim > GF_MAX_DIMS ? GF_MAX_DIMS : t->ndim;
    int64_t stride = 1;
    for (int32_t d = stored - 1; d >= 0; --d) {
      t->sizes[d] = take_size(r);
      t->strides[d] = stride;
      stride = t->sizes[d] > 0 && t->sizes[d] < 1024 ? stride * t->sizes[d] : stride;
    }
  }
  return count;
}

static size_t released_handles;

static void release_handle(void *context, void *handle) {
  (void)context;
  free(handle);
  released_handles++;
}

static void release_entry(void *context, gf_entry *entry) {
  gf_pool_release(&entry->static_inputs, release_handle, context);
  gf_pool_release(&entry->static_outputs, release_handle, context);
  gf_pool_release(&entry->keep_alive, release_handle, context);
}

/* Adds tensors with owned (malloc'd) handles to a pool; the pool owns them from then on. */
static void fill_pool(gf_pool *pool, const gf_tensor *tensors, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (tensors[i].ndim < 0 || tensors[i].ndim > GF_MAX_DIMS) {
      continue;
    }
    gf_tensor owned = tensors[i];
    owned.handle = malloc(1);
    if (owned.handle == NULL || gf_pool_add(pool, &owned, NULL) != GF_OK) {
      free(owned.handle);
    }
  }
}

enum { MAX_TENSORS = 6, MAX_KEY = 64 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  gf_cache cache;
  size_t max_entries = 1 + take_byte(&r) % 4;
  if (gf_cache_init(&cache, max_entries, release_entry, NULL, NULL) != GF_OK) {
    return 0;
  }
  gf_signature sig = {0};
  gf_tensor tensors[MAX_TENSORS];
  uint8_t key[MAX_KEY];
  while (r.left > 0) {
    uint8_t op = take_byte(&r) % 6;
    size_t key_length = take_byte(&r) % (MAX_KEY + 1);
    for (size_t i = 0; i < key_length; ++i) {
      key[i] = take_byte(&r);
    }
    size_t count = take_tensors(&r, tensors, MAX_TENSORS);
    gf_error err = {0};
    if (gf_signature_build(&sig, key, key_length, tensors, count, NULL, &err) != GF_OK) {
      if (err.message[0] == '\0') {
        abort(); /* every failure says why */
      }
      continue;
    }
    /* The signature is canonical: building it again gives the same bytes and hash. */
    gf_signature again = {0};
    if (gf_signature_build(&again, key, key_length, tensors, count, NULL, NULL) != GF_OK ||
        !gf_signature_equal(&sig, &again)) {
      abort();
    }
    gf_signature_free(&again);
    switch (op) {
    case 0:
    case 1: { /* capture: make room, insert unless present */
      if (gf_cache_find(&cache, &sig) != NULL) {
        break;
      }
      int grew = 0;
      gf_cache_make_room(&cache, &grew);
      gf_entry *entry = gf_entry_create(&sig, op == 1 && (take_byte(&r) & 1), NULL);
      if (entry == NULL) {
        break;
      }
      fill_pool(&entry->static_inputs, tensors, count);
      fill_pool(&entry->keep_alive, tensors, count / 2);
      if (gf_cache_insert(&cache, entry, NULL) != GF_OK) {
        release_entry(NULL, entry);
        gf_entry_destroy(entry);
      } else if (gf_cache_find(&cache, &sig) != entry) {
        abort(); /* what was inserted is found */
      }
      break;
    }
    case 2: { /* replay: a hit is the entry of exactly this signature */
      gf_entry *entry = gf_cache_lookup(&cache, &sig);
      if (entry != NULL && !gf_signature_equal(&entry->signature, &sig)) {
        abort();
      }
      break;
    }
    case 3: { /* evict one entry by hand */
      gf_entry *entry = gf_cache_find(&cache, &sig);
      if (entry != NULL) {
        gf_cache_remove(&cache, entry);
        if (gf_cache_find(&cache, &sig) != NULL) {
          abort();
        }
      }
      break;
    }
    case 4: /* reset */
      gf_cache_clear(&cache);
      if (cache.count != 0) {
        abort();
      }
      break;
    default: { /* a call's results: a pool filled, truncated, freed */
      gf_pool pool = {0};
      fill_pool(&pool, tensors, count);
      gf_pool_truncate(&pool, take_byte(&r) % (count + 1), release_handle, NULL);
      gf_pool_free(&pool, release_handle, NULL);
      break;
    }
    }
  }
  gf_signature_free(&sig);
  gf_cache_destroy(&cache);
  return 0;
}
