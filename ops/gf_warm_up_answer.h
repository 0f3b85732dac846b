/* The first call of a key answered from its last warm-up (Note [The first call from its last
 * warm-up], gf_warm_up_answer.c): what a capture keeps for it, and the calls the capture protocol
 * (gf_capture.c) makes into it: one before the warm-ups (whether the call may be answered so), one
 * after each forward before the capture (what it wrote, and the copies of the last one's outputs),
 * one after the capture (whether the copies stand for its replay) and the hand-over itself.
 * Private to ops/, as gf_runner_internal.h is. */
#ifndef GF_WARM_UP_ANSWER_H
#define GF_WARM_UP_ANSWER_H

#include "gf_runner_internal.h"

typedef struct gf_warm_up_answer {
  int wanted;                  /* the call may be answered so (set before the warm-ups) */
  int inputs_written;          /* a forward before the capture wrote an input in place */
  int copied;                  /* the copies were made: `outputs` holds them all */
  gf_pool outputs;             /* the copies, owned */
  gf_device_memory copies_use; /* what making them added to the device memory in use and held */
} gf_warm_up_answer;

/* Whether the call may be answered from its last warm-up at all: asked before the warm-ups, so
 * that none is kept for a call that replays. */
GF_RUNNER_PRIVATE int gf_runner_may_answer_from_warm_up(const gf_runner *runner,
                                                        const gf_call_options *options);

/* After one forward before the capture, whose status is `status`: notes the inputs it wrote in
 * place (`mutated`, `input_count` bytes; NULL counts as all written) and, where `outputs` is not
 * NULL (the last forward before the capture) and its report said it kept state (`kept_state`,
 * gf_forward_report), copies them for the call (gf_runner_copy_warm_up_outputs). Returns
 * `status`, or the copies' failure when it was GF_OK. */
GF_RUNNER_PRIVATE gf_status gf_warm_up_answer_note_forward(
    gf_runner *runner, gf_warm_up_answer *answer, gf_status status, const unsigned char *mutated,
    size_t input_count, const gf_pool *outputs, int kept_state, gf_error *err);

/* After the capture: 1 when the copies stand for the replay of `entry` (NULL: the capture failed),
 * else 0, with the copies released and their cost zeroed, so that the capture's figures keep
 * nothing out. */
GF_RUNNER_PRIVATE int gf_warm_up_answer_settle(gf_runner *runner, const gf_entry *entry,
                                               gf_warm_up_answer *answer);

/* Gives the call the copies of its last warm-up's outputs, in place of a replay of `entry`. */
GF_RUNNER_PRIVATE gf_status gf_runner_hand_over(gf_runner *runner, gf_entry *entry,
                                                gf_warm_up_answer *answer, size_t input_count,
                                                const gf_call_options *options, gf_pool *results,
                                                gf_error *err);

#endif /* GF_WARM_UP_ANSWER_H */
