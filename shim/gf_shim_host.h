// The host side of a runner built from libtorch: tensors are at::Tensor handles, the forward to
// capture is an operator found by name in the dispatcher (Python registers the module's forward,
// a C++ test registers its own), and agreement across ranks is another such operator or the
// shim's own all-reduce over a process group named at create.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern "C" {
#include "gf_host.h"
#include "gf_runner.h"
}

namespace graphed {

// A runner's share of the call in flight (Note [The call in flight], pyext/gf_call_state.h). One
// per runner, not per thread: a runner's calls are serialised by its recursive lock
// (gf_shim_registry.h), so every field is read and written by the thread that holds that lock.
// A forward stays on the thread that called it (graphed replays inference forwards; autograd's
// threads, which take a capture across threads in ATen's CUDAGraph, never run one), and a nested
// forward of the same runner (the forward calling it through the operator) saves and puts back
// what it changes.
struct RunnerCall {
  // Why the forward now running was called (GF_PHASE_EAGER outside one): written by
  // host_run_forward around each forward; read by CallState.phase and graphed::forward_phase.
  gf_forward_phase phase = GF_PHASE_EAGER;
  // Where the CPython entry's dispatched path wants to learn which entry serves its call (it goes
  // through graphed::forward, whose schema cannot carry that): set by that path around its
  // operator call, taken by the runner's next call_runner (so the forward's own calls never see
  // it).
  gf_served_entry *served_request = nullptr;
  // The thread running this runner's forward and when that forward started (a process-wide
  // count; 0: none runs), so that forward_phase() without a runner finds the innermost forward of
  // the calling thread. Atomic because that search reads other runners' records.
  std::atomic<std::thread::id> forward_thread{};
  std::atomic<uint64_t> forward_order{0};
};

// The forward and the observer of a runner, called by the host directly instead of through the
// dispatcher: what the CPython extension gives a GraphedForward's runner (pyext/gf_model_hooks.h),
// so that a forward the core runs costs no operator call and no operator is registered per
// instance. Each hook must not throw; `release` frees `context` when the runner goes.
struct DirectHooks {
  void *context = nullptr;
  // Runs the forward once on inputs, appending its outputs; fills the report (the error's kind,
  // whether the run kept state) and returns a status with err set on failure.
  gf_status (*forward)(void *context, const std::vector<at::Tensor> &inputs,
                       std::vector<at::Tensor> &outputs, gf_forward_report *report,
                       gf_error *err) noexcept = nullptr;
  // Told of an event (kind: "captured", "evicted", "disabled", "churn", "thrash", "warning"), with
  // the inputs' shapes already described (describe_shapes); may be NULL.
  void (*observe)(void *context, const char *kind, const gf_event &event,
                  const std::string &shapes) noexcept = nullptr;
  void (*release)(void *context) noexcept = nullptr;
};

struct HostContext {
  HostContext() = default;
  explicit HostContext(c10::OperatorHandle forward) : forward_op(std::move(forward)) {}
  ~HostContext() {
    if (direct.release != nullptr) {
      direct.release(direct.context);
    }
  }
  HostContext(const HostContext &) = delete;
  HostContext &operator=(const HostContext &) = delete;

  // (Tensor[] inputs) -> Tensor[]; none for a runner whose forward is direct.forward.
  std::optional<c10::OperatorHandle> forward_op;
  DirectHooks direct; // set once, right after creation (attach_direct_hooks)
  std::optional<c10::OperatorHandle> agree_op; // (Tensor ok) -> Tensor, MIN over the group
  std::string name;
  // kObserverSchema: told of every gf_event ("captured", "evicted", "disabled", "churn", "thrash")
  // and of the runner's warnings ("warning"); without it warnings go to TORCH_WARN.
  std::optional<c10::OperatorHandle> observer_op;
  // The registered name of a torch.distributed process group: agreement is the shim's own
  // all-reduce over it (gf_shim_group.h) instead of agree_op's.
  std::optional<std::string> group_name;
  c10::Device device{c10::DeviceType::CPU};
  RunnerCall call; // the runner's share of the call in flight

  // Whether the runner's capture outcomes are agreed across ranks.
  bool agrees() const { return agree_op.has_value() || group_name.has_value(); }
};

// The schema (without a name) of a runner's observer operator: the host packs its stack in this
// order, and Python defines its observers with it (graphed._observe reads it through
// graphed::observer_schema), so the fields are named here only.
extern const char *const kObserverSchema;

// Finds an operator "namespace::name" (no overload) or throws a c10::Error naming it.
c10::OperatorHandle find_operator(const std::string &qualified_name, const char *role);

// A gf_host over a new HostContext (freed by host.destroy).
gf_host make_torch_host(HostContext *context);

// Gives the runner of `slot` (made with no forward operator) its direct forward and observer,
// which it then owns (hooks.release frees them with it); a ValueError when it has a forward
// already, the hooks left to the caller. Under the runner's lock.
struct RunnerSlot;
void attach_direct_hooks(RunnerSlot &slot, DirectHooks hooks);

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
