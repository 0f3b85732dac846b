/* Why a runner is disabled, as a code for programs beside the sentence for people (the runner's
 * disabled_reason): regions, the device check and the log decide on the code, never on the words
 * (SQLite's errcode beside errmsg). Named once here; the shim exports the names in stats(). */
#ifndef GF_DISABLE_CAUSE_H
#define GF_DISABLE_CAUSE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gf_disable_cause {
  GF_CAUSE_NONE = 0,            /* enabled */
  GF_CAUSE_USER = 1,            /* the caller: enabled=False, or disable() */
  GF_CAUSE_UNAVAILABLE = 2,     /* graphs unavailable: no backend, or one that cannot serve the
                                 * device */
  GF_CAUSE_BACKEND = 3,         /* the backend could not make the runner's state */
  GF_CAUSE_CAPTURE_FAILED = 4,  /* the forward could not be captured (whole) */
  GF_CAUSE_REPLAY_FAILED = 5,   /* a replay, or the entry of one, failed */
  GF_CAUSE_VERIFY = 6,          /* verify mode saw a graph differ from eager */
  GF_CAUSE_GROUP_RELEASED = 7,  /* the process group the runner agrees over is going away */
  GF_CAUSE_WATCH = 8,           /* the watch refuses what the forward depends on (an offload hook,
                                 * a tensor with no address) */
  GF_CAUSE_RECAPTURE_LIMIT = 9, /* the watch saw the baked state change too often with no replay
                                 * between */
  GF_CAUSE_STEP_CACHE = 10      /* the forward carries a step cache's hooks, whose decisions a
                                 * graph would bake in: it runs in regions, the cached modules
                                 * graphed beneath their hooks */
} gf_disable_cause;

enum { GF_CAUSE_COUNT = 11 };

/* The cause's name ("capture_failed", ...), "none" for GF_CAUSE_NONE; NULL outside the enum. */
const char *gf_disable_cause_name(int cause);

/* The cause named `name`; -1 for a name that is none of them. */
int gf_disable_cause_of_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* GF_DISABLE_CAUSE_H */
