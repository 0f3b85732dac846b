// The one translation between at::Tensor and the core's gf_tensor, so the core never sees torch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <vector>

extern "C" {
#include "gf_status.h"
#include "gf_tensor.h"
}

namespace graphed {

// A descriptor of t; handle is NULL (borrowed) unless owned is true, in which case it owns a new
// reference to t that release_handle frees.
gf_tensor describe_tensor(const at::Tensor &t, bool owned);

// NULL when the core can take t, else the end of a sentence saying why not ("is a nested
// tensor; ..."), for an error that names the kwarg or input. Never throws for any tensor kind.
const char *unsupported_tensor_reason(const at::Tensor &t);

// A borrowed descriptor of t for a call into the core, which copies raw bytes: t itself when it
// is contiguous and neither lazily conjugated nor negated, else a resolved contiguous copy
// appended to dense, which keeps it alive for the call. The first copy reserves room for
// `capacity` (the call's tensor count), so that dense never reallocates (handles point into it)
// and calls without a copy allocate nothing. t must pass unsupported_tensor_reason.
gf_tensor describe_dense(const at::Tensor &t, std::vector<at::Tensor> &dense, size_t capacity);

// True when the core cannot read t's bytes as they are: strided, or a lazy conj/neg view. Never
// throws for a tensor that passes unsupported_tensor_reason.
bool needs_dense_copy(const at::Tensor &t);

// An input the core saw as a dense copy: its index in the call and the caller's tensor.
struct DenseInput {
  size_t index;
  const at::Tensor *original;
};

// After a call that wrote inputs in place (mutated[i] set, from gf_call_options): copies the
// dense copy the core saw (described[index]) back into each such original. Inputs the core saw
// directly were written by the core itself.
void write_back_dense(const std::vector<DenseInput> &densified, const gf_tensor *described,
                      const unsigned char *mutated);

// When err is about an input tensor (err->input_number, set by the core's device check), rewrites
// its message in torch's words: "<subject> is on cpu; the runner is on cuda:0; ...", where
// subject names the input as its caller knows it (a kwarg path, "inputs[3]"). Never throws.
void word_input_error(const at::Tensor &input, const std::string &subject,
                      c10::Device runner_device, gf_error *err);

// "bf16[8, 64], f32[3]": the dtypes and shapes of descriptors, for log lines and listings.
// Numbers are formatted with snprintf (see gf_torch_errors.h).
std::string describe_shapes(const gf_tensor *tensors, size_t count);

// The tensor a handle owns.
const at::Tensor &tensor_of_handle(void *handle);

// Takes the tensor out of a handle and frees the handle.
at::Tensor take_handle(void *handle);

void release_handle(void *handle);

} // namespace graphed
