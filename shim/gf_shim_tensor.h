// The one translation between at::Tensor and the core's gf_tensor, so the core never sees torch.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

extern "C" {
#include "gf_tensor.h"
}

namespace graphed {

// A descriptor of t; handle is NULL (borrowed) unless owned is true, in which case it owns a new
// reference to t that release_handle frees.
gf_tensor describe_tensor(const at::Tensor &t, bool owned);

// NULL when the core can take t, else the end of a sentence saying why not ("is a nested
// tensor; ..."), for an error that names the kwarg or input. Never throws for any tensor kind.
const char *unsupported_tensor_reason(const at::Tensor &t);

// True when the core can copy t's bytes as they are: contiguous, and neither lazily conjugated
// nor negated. Never throws for a tensor that passes unsupported_tensor_reason.
bool is_dense_as_is(const at::Tensor &t);

// A borrowed descriptor of t for a call into the core, which copies raw bytes: t itself when it
// is contiguous and neither lazily conjugated nor negated, else a resolved contiguous copy
// appended to dense, which keeps it alive for the call. The caller reserves dense so that it
// never reallocates (handles point into it). t must pass unsupported_tensor_reason.
gf_tensor describe_dense(const at::Tensor &t, std::vector<at::Tensor> &dense);

// The tensor a handle owns.
const at::Tensor &tensor_of_handle(void *handle);

// Takes the tensor out of a handle and frees the handle.
at::Tensor take_handle(void *handle);

void release_handle(void *handle);

} // namespace graphed
