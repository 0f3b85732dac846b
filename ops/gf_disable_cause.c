/* The names of gf_disable_cause (gf_disable_cause.h), in one table both ways. */
#include "gf_disable_cause.h"

#include <string.h>

static const char *const gf_cause_names[GF_CAUSE_COUNT] = {
    [GF_CAUSE_NONE] = "none",
    [GF_CAUSE_USER] = "user",
    [GF_CAUSE_UNAVAILABLE] = "unavailable",
    [GF_CAUSE_BACKEND] = "backend",
    [GF_CAUSE_CAPTURE_FAILED] = "capture_failed",
    [GF_CAUSE_REPLAY_FAILED] = "replay_failed",
    [GF_CAUSE_VERIFY] = "verify",
    [GF_CAUSE_GROUP_RELEASED] = "group_released",
    [GF_CAUSE_WATCH] = "watch",
    [GF_CAUSE_RECAPTURE_LIMIT] = "recapture_limit",
    [GF_CAUSE_STEP_CACHE] = "step_cache",
};

const char *gf_disable_cause_name(int cause) {
  return cause >= 0 && cause < GF_CAUSE_COUNT ? gf_cause_names[cause] : NULL;
}

int gf_disable_cause_of_name(const char *name) {
  for (int cause = 0; name != NULL && cause < GF_CAUSE_COUNT; ++cause) {
    if (strcmp(gf_cause_names[cause], name) == 0) {
      return cause;
    }
  }
  return -1;
}
