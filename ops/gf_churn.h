/* The churn guard: when new keys keep arriving without being reused (a Python value or a shape
 * that changes on every call), capturing each one costs a capture per call and fills the graph
 * pool for nothing. After `limit` new keys in a row with no hit in between, the guard admits a new
 * key to capture only when it comes a second time (its hash seen among the last GF_CHURN_SEEN
 * keys the guard ran eager); the others run eager, and graphs already captured keep replaying.
 * GF_CHURN_QUIET hits in a row, or a reset, end the guard. A server's fixed set of shapes is
 * captured as each comes again; a value that never repeats runs eager.
 * A new key whose tensors have the dtypes and shapes of the new key just before it (no hit
 * between), differing only in a non-tensor value, starts the guard at once (when limit > 0): a
 * Python number that changes every call makes every call such a key, and each capture of it costs
 * several forwards (a 40-call float storm measured 1.43-1.48x eager's time with two captures,
 * 1.31-1.35x with one, on the H200); a decode loop (prompt, then tokens) and a server's shapes
 * differ in shape and count against `limit` as before. Two such calls may be two requests'
 * settings, so a guard started this way is reported (the host warns) only once
 * GF_CHURN_VALUE_REPORT new keys have come in a row. A new key whose call raised (the forward's own
 * error) is no traffic and does not count (gf_churn_forget). */
#ifndef GF_CHURN_H
#define GF_CHURN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  GF_CHURN_SEEN = 64,        /* keys the guard remembers having run eager */
  GF_CHURN_QUIET = 64,       /* hits in a row that end the guard */
  GF_CHURN_DEFAULT = 2,      /* new keys in a row (no hit between) that start it */
  GF_CHURN_VALUE_REPORT = 4, /* new keys in a row before a guard a value started is reported */
};

typedef struct gf_churn {
  uint32_t limit;           /* new keys in a row that start the guard; 0: never */
  uint32_t misses_in_a_row; /* new keys since the last hit */
  uint32_t hits_in_a_row;   /* hits since the last new key */
  uint64_t tensors_before;  /* while misses_in_a_row > 0: the hash of the last new key's tensors */
  int guarding;
  int report_pending;           /* started by a value storm, not reported yet */
  uint64_t seen[GF_CHURN_SEEN]; /* hashes of keys the guard ran eager (0: empty) */
  size_t seen_next;
  uint64_t eager_calls; /* calls the guard ran eager instead of capturing */
  uint64_t trips;       /* times it started guarding */
} gf_churn;

/* A call whose key has a graph. */
void gf_churn_hit(gf_churn *churn);

/* A call whose key has no graph, of hash `key_hash`, its tensors' dtypes and shapes of hash
 * `tensors_hash`: 1 to capture it, 0 to run it eager (counted). *report is 1 when the host should
 * now be told that the guard holds new keys back (it started with this call, or a guard a value
 * storm started has now seen GF_CHURN_VALUE_REPORT new keys in a row). */
int gf_churn_admit(gf_churn *churn, uint64_t key_hash, uint64_t tensors_hash, int *report);

/* The new key just admitted raised in its forward (its own error): it does not count. */
void gf_churn_forget(gf_churn *churn);

/* Forgets everything but the limit and the counts (reset(): the keys to come are new traffic). */
void gf_churn_restart(gf_churn *churn);

/* The graphs were dropped because what they read changed (gf_runner_drop_graphs): the keys to come
 * are the same traffic captured again, so the run of new keys starts over (a key captured again is
 * no value storm), while whether the guard holds keys back, and the keys it ran eager, stay. */
void gf_churn_graphs_dropped(gf_churn *churn);

#ifdef __cplusplus
}
#endif

#endif /* GF_CHURN_H */
