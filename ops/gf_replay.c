/* The replay path of a runner (see gf_runner_internal.h): what a cache hit costs on the host. It
 * builds the input copies, the output slots and the write-backs of mutated inputs in the runner's
 * scratch list, then launches the graph once when the copies were folded into it at capture, or
 * runs a batched copy on either side of a plain launch. Nothing here may add work per call. */
#include "gf_runner_internal.h"

#include <string.h>

/* The input copies of a replay, one per input: an input already at its static buffer (same
 * address, sizes and strides) gets a zero-byte copy. */
static void gf_runner_input_copies(const gf_entry *entry, const gf_tensor *inputs, size_t count,
                                   gf_copy *copies) {
  for (size_t i = 0; i < count; ++i) {
    const gf_tensor *fixed = &entry->static_inputs.tensors[i];
    size_t bytes = gf_tensor_same_view(fixed, &inputs[i]) ? 0 : (size_t)gf_tensor_nbytes(fixed);
    copies[i] = (gf_copy){fixed->data, bytes ? inputs[i].data : fixed->data, bytes};
  }
}

/* The write-backs of a replay, one per input the forward writes in place: the static buffer's new
 * values into the caller's tensor (zero bytes when the caller passed the static buffer itself).
 * Marks those inputs in mutated when the caller asked. */
static void gf_runner_write_back_copies(const gf_entry *entry, const gf_tensor *inputs,
                                        gf_copy *copies, unsigned char *mutated,
                                        size_t input_count) {
  if (mutated != NULL) {
    memset(mutated, 0, input_count);
  }
  for (size_t m = 0; m < entry->mutated_count; ++m) {
    const size_t i = entry->mutated_inputs[m];
    const gf_tensor *fixed = &entry->static_inputs.tensors[i];
    size_t bytes = gf_tensor_same_view(fixed, &inputs[i]) ? 0 : (size_t)gf_tensor_nbytes(fixed);
    copies[m] = (gf_copy){bytes ? inputs[i].data : fixed->data, fixed->data, bytes};
    if (mutated != NULL) {
      mutated[i] = 1;
    }
  }
}

/* Appends the call's outputs to results (fresh tensors, or the static ones when asked) and
 * fills copies with the copies that fill them, one per output (zero bytes for static ones). */
static gf_status gf_runner_output_slots(gf_runner *runner, const gf_entry *entry,
                                        const gf_call_options *options, gf_pool *results,
                                        gf_copy *copies, gf_error *err) {
  const gf_pool *outputs = &entry->static_outputs;
  gf_status status = GF_OK;
  for (size_t i = 0; status == GF_OK && i < outputs->count; ++i) {
    const gf_tensor *fixed = &outputs->tensors[i];
    gf_tensor out = {0};
    if (options->static_outputs) {
      status = runner->host.retain(runner->host.context, fixed, &out, err);
      copies[i] = (gf_copy){fixed->data, fixed->data, 0};
    } else {
      status = runner->host.empty_like(runner->host.context, fixed, &out, err);
      copies[i] = (gf_copy){out.data, fixed->data, (size_t)gf_tensor_nbytes(fixed)};
    }
    status = gf_runner_adopt(runner, results, status, &out, err);
  }
  return status;
}

/* The replay path: refresh the static inputs, launch, fill the outputs and write mutated inputs
 * back. When the copies were folded into the graph at capture this is one launch (the
 * write-backs ride in the output node's table); otherwise a batched copy on either side of it. */
gf_status gf_runner_replay(gf_runner *runner, gf_entry *entry, const gf_tensor *inputs,
                           size_t count, const gf_call_options *options, gf_pool *results,
                           gf_error *err) {
  const size_t output_count = entry->static_outputs.count + entry->mutated_count;
  gf_status status = gf_runner_reserve_copies(runner, count + output_count, err);
  if (status != GF_OK) {
    return status;
  }
  gf_copy *input_copies = runner->scratch_copies;
  gf_copy *output_copies = runner->scratch_copies + count;
  gf_runner_input_copies(entry, inputs, count, input_copies);
  gf_runner_write_back_copies(entry, inputs, output_copies + entry->static_outputs.count,
                              options->mutated_inputs, count);
  status = gf_runner_output_slots(runner, entry, options, results, output_copies, err);
  const gf_backend *backend = runner->backend;
  int launched = 0;
  if (status == GF_OK && entry->folded) {
    status = backend->launch_folded(backend->context, runner->backend_state, entry->graph,
                                    input_copies, count, output_copies, output_count, err);
    launched = status == GF_OK;
    if (status == GF_ERR_NOT_FOUND) {
      entry->folded = 0; /* the nodes were not found: plain launches from now on */
      status = GF_OK;
    }
  }
  if (status == GF_OK && !launched) {
    status = gf_runner_copy_nonempty(runner, input_copies, count, err);
    if (status == GF_OK) {
      status = backend->launch(backend->context, runner->backend_state, entry->graph, err);
    }
    if (status == GF_OK) {
      status = gf_runner_copy_nonempty(runner, output_copies, output_count, err);
    }
  }
  if (status != GF_OK) {
    return status; /* gf_runner_call releases the outputs this call appended */
  }
  entry->replays++;
  runner->replays++;
  if (options->served != NULL) {
    options->served->user = &entry->user;
  }
  return GF_OK;
}
