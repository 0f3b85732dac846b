/* The first call of a key answered from its last warm-up, in place of a replay of the graph it
 * just captured (Note [The first call from its last warm-up], below): whether a call may be
 * answered so, the copies of the last warm-up's outputs, the test that they stand for a replay,
 * and the hand-over. The capture protocol (gf_capture.c) calls it at the points
 * gf_warm_up_answer.h lists; it calls none of the runner's other files. */
#include "gf_warm_up_answer.h"

#include <string.h>

/* Note [The first call from its last warm-up]
 * Q: The first call of a key runs its warm-ups, the capture and then a replay of the new graph.
 *    Why not give it what its last warm-up computed?
 * A: Where nothing can tell the two apart, it does: the call gets copies of the last warm-up's
 *    outputs and the replay is not run, which saves its device time on every new key (on an H200,
 *    2.8 ms of the 54 ms first call of the big benchmark DiT). The copies are made right after
 *    that warm-up, on the caller's stream and in the caller's memory (the backend's
 *    caller_stream_begin/end), so that the warm-up's outputs go back to the pool the capture then
 *    allocates from, as before. They stand for a replay only where a replay would compute the
 *    same and leave the same behind:
 *    - no input was written in place, by a warm-up or by the capture's forward: a replay copies
 *      the caller's values in again and writes the new ones back into the caller's tensors;
 *    - the host says the warm-up changed no other state (gf_forward_report.kept_state): a state
 *      tensor it wrote was put back after it, and a replay would write it again, as eager does;
 *    - the caller wants fresh outputs: static_outputs hands out the graph's own buffers, which
 *      only a replay fills;
 *    - there is no process group: the ranks' hosts may answer differently, and a rank that
 *      replays a graph holding a collective would wait for one that does not;
 *    - the capture's forward returned as many outputs, of the same dtypes and shapes.
 *    Otherwise, or where the backend has no such hooks, the call replays. Such a call counts a
 *    capture and no replay, its copies are left out of the capture's device memory, and verify
 *    mode compares the graph's first replay instead (gf_served_entry.from_warm_up). The copies
 *    live through the capture, one set of outputs in torch's ordinary pool that a replay would
 *    allocate after it; and the graph's first launch moves to the key's second call. */

/* Whether the call may be answered from its last warm-up at all (Note [The first call from its
 * last warm-up]): asked before the warm-ups, so that none is kept for a call that replays. */
int gf_runner_may_answer_from_warm_up(const gf_runner *runner, const gf_call_options *options) {
  const gf_backend *backend = runner->backend;
  return !options->static_outputs && runner->host.agree == NULL &&
         backend->caller_stream_begin != NULL;
}

/* Copies, for its call, the outputs of the warm-up that just ran (Note [The first call from its
 * last warm-up]) where no forward before the capture wrote an input in place and its host says it
 * changed no other state; else leaves answer->outputs empty, as it does when the copies cannot be
 * made (the call then replays). Fails only where the side stream could not be made to wait for
 * the copies: the warm-up's outputs, which they read, are freed there next. */
static gf_status gf_runner_copy_warm_up_outputs(gf_runner *runner, const gf_pool *outputs,
                                                int kept_state, gf_warm_up_answer *answer,
                                                gf_error *err) {
  if (answer->inputs_written || !kept_state) {
    return GF_OK;
  }
  const gf_backend *backend = runner->backend;
  gf_error declined = {0}; /* a copy that cannot be made only means a replay */
  if (backend->caller_stream_begin(backend->context, runner->backend_state, &declined) != GF_OK) {
    return GF_OK;
  }
  const gf_device_memory before = gf_runner_device_memory(runner);
  gf_status status = gf_runner_reserve_copies(runner, outputs->count, &declined);
  for (size_t i = 0; status == GF_OK && i < outputs->count; ++i) {
    const gf_tensor *computed = &outputs->tensors[i];
    gf_tensor copy = {0};
    status = runner->host.empty_like(runner->host.context, computed, &copy, &declined);
    runner->scratch_copies[i] =
        (gf_copy){copy.data, computed->data, (size_t)gf_tensor_nbytes(computed)};
    status = gf_runner_adopt(runner, &answer->outputs, status, &copy, &declined);
  }
  if (status == GF_OK) {
    status = gf_runner_copy_nonempty(runner, runner->scratch_copies, outputs->count, &declined);
  }
  const gf_device_memory after = gf_runner_device_memory(runner);
  answer->copies_use.in_use = gf_bytes_growth(before.in_use, after.in_use);
  answer->copies_use.reserved = gf_bytes_growth(before.reserved, after.reserved);
  answer->copied = status == GF_OK;
  if (status != GF_OK) {
    gf_runner_discard_outputs(runner, &answer->outputs);
  }
  return backend->caller_stream_end(backend->context, runner->backend_state, err);
}

/* After each forward before the capture (gf_warm_up_answer.h). */
gf_status gf_warm_up_answer_note_forward(gf_runner *runner, gf_warm_up_answer *answer,
                                         gf_status status, const unsigned char *mutated,
                                         size_t input_count, const gf_pool *outputs, int kept_state,
                                         gf_error *err) {
  for (size_t i = 0; i < input_count; ++i) {
    answer->inputs_written |= mutated == NULL || mutated[i]; /* unknown counts as written */
  }
  if (status == GF_OK && outputs != NULL) {
    status = gf_runner_copy_warm_up_outputs(runner, outputs, kept_state, answer, err);
  }
  return status;
}

/* Whether the copies of the last warm-up's outputs stand for this entry's replay: they were made
 * (or the forward returns no tensor), the capture's forward wrote no input in place either, and it
 * returned tensors of the same number, dtypes, devices and shapes. */
static int gf_runner_warm_up_answers(const gf_entry *entry, const gf_warm_up_answer *answer) {
  const gf_pool *captured = &entry->static_outputs;
  if (!answer->copied || entry->mutated_count > 0 || answer->outputs.count != captured->count) {
    return 0;
  }
  for (size_t i = 0; i < captured->count; ++i) {
    if (!gf_tensor_same_shape(&answer->outputs.tensors[i], &captured->tensors[i])) {
      return 0;
    }
  }
  return 1;
}

/* After the capture: keeps the copies only where they stand (gf_warm_up_answer.h). */
int gf_warm_up_answer_settle(gf_runner *runner, const gf_entry *entry, gf_warm_up_answer *answer) {
  const int answered = entry != NULL && gf_runner_warm_up_answers(entry, answer);
  if (!answered) {
    gf_runner_discard_outputs(runner, &answer->outputs);
    answer->copies_use = (gf_device_memory){0, 0}; /* the capture's figures keep nothing out */
  }
  return answered;
}

/* Gives the call the copies of its last warm-up's outputs, in place of a replay of `entry`. */
gf_status gf_runner_hand_over(gf_runner *runner, gf_entry *entry, gf_warm_up_answer *answer,
                              size_t input_count, const gf_call_options *options, gf_pool *results,
                              gf_error *err) {
  gf_status status = GF_OK;
  size_t moved = 0;
  for (; status == GF_OK && moved < answer->outputs.count; ++moved) {
    status = gf_pool_add(results, &answer->outputs.tensors[moved], err);
  }
  if (status != GF_OK) {
    moved--; /* the one that failed stays the answer's, to be released with the rest */
  }
  for (size_t i = moved; i < answer->outputs.count; ++i) {
    runner->host.release(runner->host.context, answer->outputs.tensors[i].handle);
  }
  answer->outputs.count = 0; /* the handles moved are the results' now */
  gf_pool_free(&answer->outputs, NULL, NULL);
  if (status != GF_OK) {
    return status; /* gf_runner_call releases the outputs this call appended */
  }
  if (options->mutated_inputs != NULL) {
    memset(options->mutated_inputs, 0, input_count);
  }
  if (options->served != NULL) {
    options->served->user = &entry->user;
    options->served->from_warm_up = 1;
  }
  return GF_OK;
}
