/* The signature of a call: the non-tensor key (the kwargs tree's shape, every non-tensor value and
 * the variant, encoded by the caller as opaque bytes) plus each tensor's dtype, device and shape.
 * It is built as canonical bytes; the 64-bit hash only picks a bucket, equality compares the
 * bytes, so two different signatures never share a cache entry. */
#ifndef GF_SIGNATURE_H
#define GF_SIGNATURE_H

#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gf_signature {
  unsigned char *bytes;
  size_t length;
  size_t capacity;
  uint64_t hash;
} gf_signature;

typedef uint64_t (*gf_hash_fn)(const unsigned char *bytes, size_t length);

/* The default hash: a word-at-a-time multiplicative hash of the canonical bytes. */
uint64_t gf_signature_default_hash(const unsigned char *bytes, size_t length);

/* Rebuilds sig in place (reusing its buffer) from the key and the tensors; hash_fn may be NULL
 * for the default. Fails only when memory runs out or a tensor has too many dimensions. */
gf_status gf_signature_build(gf_signature *sig, const void *key, size_t key_length,
                             const gf_tensor *tensors, size_t tensor_count, gf_hash_fn hash_fn,
                             gf_error *err);

/* Marks a built signature with the state of what its graph reads besides the call (a module's
 * adapter state, gf_runner_select_state): 8 more bytes, compared like the rest, and the hash mixed
 * with it. State 0 adds nothing. */
gf_status gf_signature_add_state(gf_signature *sig, uint64_t state, gf_error *err);

/* Deep copy of src into dst (dst must be empty or already owned). */
gf_status gf_signature_copy(gf_signature *dst, const gf_signature *src, gf_error *err);

/* The caller's key inside a signature's bytes (they start with its u64 length). */
const unsigned char *gf_signature_key(const gf_signature *sig, size_t *key_length);

/* The default hash of the signature's bytes after the caller's key: its tensors' dtypes, devices
 * and shapes (0 for an empty signature), so that two keys can be told to differ in values only. */
uint64_t gf_signature_tensors_hash(const gf_signature *sig);

/* 1 when a and b are the same signature (same hash and same canonical bytes). */
int gf_signature_equal(const gf_signature *a, const gf_signature *b);

void gf_signature_free(gf_signature *sig);

#ifdef __cplusplus
}
#endif

#endif /* GF_SIGNATURE_H */
