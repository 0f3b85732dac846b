/* What a runner tells its host of churn, both messages side by side: the churn guard (gf_churn.h)
 * holding new keys back, and, where the guard is off, captures that keep evicting. Each goes to
 * the host as an event of its own kind (CHURN, THRASH: gf_host.h), which the shim turns into one
 * warning. gf_runner.c and
 * gf_capture.c call this file; it calls none of the runner's other files. */
#include "gf_runner_internal.h"

#include <stdio.h>

enum {
  /* captures past this many times max_entries, with evictions, are told as churn where the churn
   * guard does not hold new keys back (churn_limit 0, or a runner with a process group) */
  GF_THRASH_FACTOR = 4
};

/* Tells the host of churn (a CHURN or THRASH event with `message`; see gf_host.h). */
static void gf_runner_tell_churn(const gf_runner *runner, gf_event_kind kind, const char *message) {
  gf_event churn = {.kind = kind,
                    .message = message,
                    .device_bytes = -1,
                    .reserved_bytes = -1,
                    .count = runner->captures};
  gf_runner_notify(runner, &churn);
}

/* Tells the host the churn guard (gf_churn.h) holds new keys back: a CHURN event saying how many
 * new keys came in a row. Sent before the call that makes the report runs eager: a host naming
 * what changed from call to call says it once it has recorded that call too. */
void gf_runner_report_churn(gf_runner *runner) {
  char message[256];
  snprintf(message, sizeof message,
           "%u new keys in a row, none reused: new keys now run eager until they come a second "
           "time; graphs already captured keep replaying",
           (unsigned)runner->churn.misses_in_a_row);
  gf_runner_tell_churn(runner, GF_EVENT_CHURN, message);
}

/* Tells the host, once, that captures keep evicting where the churn guard (gf_churn.h) is off:
 * keys that change on every call, or a cache too small for the shapes in use. */
void gf_runner_report_thrash(gf_runner *runner) {
  const int guarded = runner->churn.limit > 0 && runner->host.agree == NULL;
  if (guarded || runner->thrash_said || runner->cache.evictions == 0 ||
      runner->captures <= GF_THRASH_FACTOR * runner->cache.max_entries) {
    return;
  }
  runner->thrash_said = 1;
  char message[256];
  snprintf(message, sizeof message,
           "%llu captures and %llu evictions with max_entries=%zu: calls keep making new keys "
           "(a value or shape that changes per call) or the cache is too small for the shapes in "
           "use",
           (unsigned long long)runner->captures, (unsigned long long)runner->cache.evictions,
           runner->cache.max_entries);
  gf_runner_tell_churn(runner, GF_EVENT_THRASH, message);
}
