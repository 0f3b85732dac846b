// The host side of a runner built from libtorch: tensors are at::Tensor handles, the forward to
// capture is an operator found by name in the dispatcher (Python registers the module's forward,
// a C++ test registers its own), and agreement across ranks is another such operator or the
// shim's own all-reduce over a process group named at create.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

extern "C" {
#include "gf_host.h"
}

namespace graphed {

struct HostContext {
  c10::OperatorHandle forward_op;              // (Tensor[] inputs) -> Tensor[]
  std::optional<c10::OperatorHandle> agree_op; // (Tensor ok) -> Tensor, MIN over the group
  std::string name;
  // (str kind, str message, float seconds, int device_bytes, int reserved_bytes, int static_bytes,
  //  int count, str shapes) -> (): told of every gf_event ("captured", "evicted", "disabled",
  //  "churn") and
  // of the runner's warnings ("warning"); without it warnings go to TORCH_WARN.
  std::optional<c10::OperatorHandle> observer_op;
  // The registered name of a torch.distributed process group: agreement is the shim's own
  // all-reduce over it (gf_shim_group.h) instead of agree_op's.
  std::optional<std::string> group_name;
  c10::Device device{c10::DeviceType::CPU};

  // Whether the runner's capture outcomes are agreed across ranks.
  bool agrees() const { return agree_op.has_value() || group_name.has_value(); }
};

// Finds an operator "namespace::name" (no overload) or throws a c10::Error naming it.
c10::OperatorHandle find_operator(const std::string &qualified_name, const char *role);

// A gf_host over a new HostContext (freed by host.destroy).
gf_host make_torch_host(HostContext *context);

// Why the forward running on this thread was called (GF_PHASE_EAGER outside the host's runs);
// the forward operator reads it through graphed::forward_phase.
gf_forward_phase forward_phase();

// Marks that the forward now running in this thread raised an error of its own (a Python
// forward's ValueError, KeyboardInterrupt, ...), not a failure of the capture: host_run_forward
// then returns GF_ERR_FORWARD. The core alone decides what that means: without agreement the
// caller gets the error and the runner stays enabled; with a process group it is a capture
// failure, so that the ranks disable together.
void mark_forward_error();

// Releases what a CPython entry point keeps in a cache entry (gf_entry.user: its output template):
// the shim has no Python, so the extension installs the function when it loads, as it installs
// the interpreter-lock runners (gf_shim_interpreter_lock.h). The core calls it, through the host's
// release_user, when the entry goes: evicted, dropped by reset or disable, or with its runner.
// Without one installed, user data is left as it is (nothing but the extension sets any).
using EntryUserRelease = void (*)(void *user) noexcept;
void set_entry_user_release(EntryUserRelease release);

// Calls a (Tensor[]) -> Tensor[] operator through the boxed dispatcher.
std::vector<at::Tensor> call_tensor_list_op(const c10::OperatorHandle &op,
                                            const std::vector<at::Tensor> &inputs);

} // namespace graphed
