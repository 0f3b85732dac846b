// Translation between at::Tensor and gf_tensor (see gf_shim_tensor.h).
#include "gf_shim_tensor.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace graphed {

namespace {

// The sub-byte integer dtypes torch defines but cannot copy_ (no copy kernel): a capture would
// fail at the static copy.
bool is_shell_dtype(c10::ScalarType type) {
  switch (type) {
  case c10::ScalarType::UInt1:
  case c10::ScalarType::UInt2:
  case c10::ScalarType::UInt3:
  case c10::ScalarType::UInt4:
  case c10::ScalarType::UInt5:
  case c10::ScalarType::UInt6:
  case c10::ScalarType::UInt7:
  case c10::ScalarType::Int1:
  case c10::ScalarType::Int2:
  case c10::ScalarType::Int3:
  case c10::ScalarType::Int4:
  case c10::ScalarType::Int5:
  case c10::ScalarType::Int6:
  case c10::ScalarType::Int7:
    return true;
  default:
    return false;
  }
}

} // namespace

gf_tensor describe_tensor(const at::Tensor &t, bool owned) {
  gf_tensor d{};
  d.data = t.data_ptr();
  d.dtype = static_cast<int32_t>(t.scalar_type());
  d.itemsize = static_cast<int32_t>(t.element_size());
  d.device_type = static_cast<int32_t>(t.device().type());
  d.device_index = t.device().has_index() ? static_cast<int32_t>(t.device().index()) : -1;
  const int64_t ndim = t.dim();
  d.ndim = static_cast<int32_t>(ndim);
  const size_t stored = static_cast<size_t>(std::min<int64_t>(ndim, GF_MAX_DIMS));
  std::memcpy(d.sizes, t.sizes().data(), stored * sizeof(int64_t));
  std::memcpy(d.strides, t.strides().data(), stored * sizeof(int64_t));
  d.handle = owned ? new at::Tensor(t) : nullptr;
  return d;
}

const char *unsupported_tensor_reason(const at::Tensor &t) {
  if (!t.defined()) {
    return "is an undefined tensor";
  }
  if (t.is_nested()) {
    return "is a nested tensor; pass its components as a list of tensors";
  }
  if (t.layout() != c10::kStrided) {
    return "is not a strided (dense) tensor (sparse or mkldnn); convert it with .to_dense()";
  }
  if (t.is_meta()) {
    return "is a meta tensor, which holds no data";
  }
  if (t.is_quantized()) {
    return "is a quantized tensor; pass its int_repr() and scales as tensors";
  }
  if (is_shell_dtype(t.scalar_type())) {
    return "has a sub-byte dtype (int1-int7, uint1-uint7) that torch cannot copy; pass a view "
           "of its bytes (.view(torch.uint8)) and reinterpret it inside the forward";
  }
  if (!t.has_storage()) {
    return "has no storage (a functorch or other wrapper tensor); call graphed outside vmap and "
           "grad transforms";
  }
  return nullptr;
}

gf_tensor describe_dense(const at::Tensor &t, std::vector<at::Tensor> &dense, size_t capacity) {
  const at::Tensor *view = &t;
  if (needs_dense_copy(t)) {
    if (dense.empty()) {
      dense.reserve(capacity);
    }
    // Copies are normal tensors even under inference_mode, so that a forward's in-place write
    // to one is seen (by its version counter) and copied back to t. A lazily conjugated or
    // negated view is resolved: the core copies bytes, so it gets the resolved values.
    c10::InferenceMode normal_tensors(false);
    dense.push_back(t.is_conj() || t.is_neg() ? t.resolve_conj().resolve_neg().contiguous()
                                              : t.contiguous());
    view = &dense.back();
  }
  // Otherwise described as it is: the common case takes no guard and makes no copy (an
  // inference-mode guard per tensor was a per-tensor host cost in the benchmark; see
  // docs/benchmarks.md).
  gf_tensor described = describe_tensor(*view, false);
  described.handle = const_cast<at::Tensor *>(view);
  return described;
}

bool needs_dense_copy(const at::Tensor &t) {
  return !t.is_contiguous() || t.is_conj() || t.is_neg();
}

void write_back_dense(const std::vector<DenseInput> &densified, const gf_tensor *described,
                      const unsigned char *mutated) {
  for (const DenseInput &input : densified) {
    if (mutated[input.index]) {
      input.original->copy_(tensor_of_handle(described[input.index].handle));
    }
  }
}

void word_input_error(const at::Tensor &input, const std::string &subject,
                      c10::Device runner_device, gf_error *err) {
  if (err == nullptr || err->input_number == 0) {
    return;
  }
  try {
    const std::string device = input.device().str();
    const std::string runner = runner_device.str();
    // A CPU input is what pipelines pass (rotary tables built on the host): the option that
    // stages those is named where the refusal is read.
    const char *option = input.device().is_cpu() && !runner_device.is_cpu()
                             ? ", or let GraphedForward(..., cpu_inputs='to_device') copy CPU "
                               "inputs there for a forward that moves them itself"
                             : "";
    std::snprintf(err->message, sizeof err->message,
                  "graphed: %s is on %s; the runner is on %s: move the tensor there before the "
                  "call (tensor.to('%s'))%s",
                  subject.c_str(), device.c_str(), runner.c_str(), runner.c_str(), option);
  } catch (...) {
    // Out of memory for two short strings: the core's message stays, in the core's words.
  }
}

std::string describe_shapes(const gf_tensor *tensors, size_t count) {
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    const auto dtype = static_cast<c10::ScalarType>(tensors[i].dtype);
    const char *name = dtype == c10::kFloat      ? "f32"
                       : dtype == c10::kHalf     ? "f16"
                       : dtype == c10::kBFloat16 ? "bf16"
                       : dtype == c10::kLong     ? "i64"
                       : dtype == c10::kInt      ? "i32"
                       : dtype == c10::kBool     ? "bool"
                                                 : c10::toString(dtype);
    text += i ? ", " : "";
    text += name;
    text += "[";
    for (int32_t d = 0; d < tensors[i].ndim && d < GF_MAX_DIMS; ++d) {
      char size[32];
      std::snprintf(size, sizeof size, "%s%lld", d ? ", " : "",
                    static_cast<long long>(tensors[i].sizes[d]));
      text += size;
    }
    text += "]";
  }
  return text;
}

const at::Tensor &tensor_of_handle(void *handle) { return *static_cast<at::Tensor *>(handle); }

at::Tensor take_handle(void *handle) {
  auto *owned = static_cast<at::Tensor *>(handle);
  at::Tensor t = std::move(*owned);
  delete owned;
  return t;
}

void release_handle(void *handle) { delete static_cast<at::Tensor *>(handle); }

} // namespace graphed
