/* Keys held back after running out of device memory (see gf_backoff.h). */
#include "gf_backoff.h"

#include <string.h>

static size_t gf_backoff_slot(const gf_backoff *backoff, uint64_t hash) {
  for (size_t i = 0; i < GF_BACKOFF_KEYS; ++i) {
    if (backoff->hash[i] == hash) {
      return i;
    }
  }
  return GF_BACKOFF_KEYS;
}

/* 0 marks an empty slot: a key hashing to 0 is held as 1 (a collision holds back another key for
 * a while, which costs eager calls, never a wrong result). */
static uint64_t gf_backoff_name(uint64_t hash) { return hash != 0 ? hash : 1; }

int gf_backoff_holds(gf_backoff *backoff, uint64_t hash, uint64_t now, uint64_t evictions) {
  if (evictions != backoff->evictions) {
    gf_backoff_clear(backoff);
    backoff->evictions = evictions;
    return 0;
  }
  const size_t slot = gf_backoff_slot(backoff, gf_backoff_name(hash));
  return slot < GF_BACKOFF_KEYS && now < backoff->until[slot];
}

uint64_t gf_backoff_hold(gf_backoff *backoff, uint64_t hash, uint64_t now, uint64_t evictions) {
  const uint64_t name = gf_backoff_name(hash);
  size_t slot = gf_backoff_slot(backoff, name);
  uint64_t length = GF_BACKOFF_FIRST;
  if (slot < GF_BACKOFF_KEYS) {
    length =
        backoff->length[slot] * 2 < GF_BACKOFF_MOST ? backoff->length[slot] * 2 : GF_BACKOFF_MOST;
  } else {
    slot = backoff->next;
    backoff->next = (backoff->next + 1) % GF_BACKOFF_KEYS;
  }
  backoff->hash[slot] = name;
  backoff->length[slot] = length;
  backoff->until[slot] = now + length;
  backoff->evictions = evictions;
  return length;
}

void gf_backoff_clear(gf_backoff *backoff) {
  const uint64_t evictions = backoff->evictions;
  memset(backoff, 0, sizeof *backoff);
  backoff->evictions = evictions;
}
