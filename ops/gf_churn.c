/* The churn guard (see gf_churn.h). */
#include "gf_churn.h"

#include <string.h>

void gf_churn_hit(gf_churn *churn) {
  churn->misses_in_a_row = 0;
  if (churn->guarding && ++churn->hits_in_a_row >= GF_CHURN_QUIET) {
    gf_churn_restart(churn);
  }
}

/* Whether the guard ran `key_hash` eager before (and forgets it: its second sight captures). */
static int gf_churn_seen_before(gf_churn *churn, uint64_t key_hash) {
  for (size_t i = 0; i < GF_CHURN_SEEN; ++i) {
    if (churn->seen[i] == key_hash) {
      churn->seen[i] = 0;
      return 1;
    }
  }
  return 0;
}

int gf_churn_admit(gf_churn *churn, uint64_t key_hash, uint64_t tensors_hash, int *report) {
  *report = 0;
  churn->hits_in_a_row = 0;
  const int values_only = churn->misses_in_a_row > 0 && churn->tensors_before == tensors_hash;
  churn->tensors_before = tensors_hash;
  ++churn->misses_in_a_row;
  if (churn->limit == 0) {
    return 1;
  }
  if (!churn->guarding) {
    if (churn->misses_in_a_row <= churn->limit && !values_only) {
      return 1;
    }
    churn->guarding = 1;
    ++churn->trips;
    churn->report_pending = churn->misses_in_a_row <= churn->limit; /* a value storm's start */
    *report = !churn->report_pending;
  } else if (churn->report_pending && churn->misses_in_a_row >= GF_CHURN_VALUE_REPORT) {
    churn->report_pending = 0;
    *report = 1;
  }
  /* 0 marks an empty slot: a key hashing to 0 is remembered as 1 (a collision costs a capture). */
  const uint64_t remembered = key_hash != 0 ? key_hash : 1;
  if (gf_churn_seen_before(churn, remembered)) {
    return 1;
  }
  churn->seen[churn->seen_next] = remembered;
  churn->seen_next = (churn->seen_next + 1) % GF_CHURN_SEEN;
  ++churn->eager_calls;
  return 0;
}

void gf_churn_forget(gf_churn *churn) {
  if (churn->misses_in_a_row > 0) {
    --churn->misses_in_a_row;
  }
}

void gf_churn_graphs_dropped(gf_churn *churn) { churn->misses_in_a_row = 0; }

void gf_churn_restart(gf_churn *churn) {
  churn->misses_in_a_row = 0;
  churn->hits_in_a_row = 0;
  churn->guarding = 0;
  churn->report_pending = 0;
  memset(churn->seen, 0, sizeof churn->seen);
  churn->seen_next = 0;
}
