// One runner call on the torch side, shared by the graphed::forward operator's kernel
// (gf_shim_ops.cpp) and the CPython entry point (pyext/gf_fastcall_torch.cpp), so that the rules
// of a call are written once: inputs the core cannot read as they are go in as copies (dense
// copies, whose in-place writes are copied back after the call; CPU inputs staged on the runner's
// device where it asks for that); the runner's lock is held around the core call only; every
// output handle the core made is released, on success and failure alike. The two callers differ
// in how they wait for the lock and where the outputs go.
#pragma once

#include "gf_shim_registry.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

extern "C" {
#include "gf_runner.h"
#include "gf_status.h"
#include "gf_tensor.h"
}

namespace graphed {

// How a call waits for a runner's lock that another thread holds.
enum class LockPolicy {
  // As it is: the operator's kernel, which torch.ops reaches with the interpreter's lock released.
  plain,
  // With the interpreter's lock released while it waits (run_without_interpreter_lock), so that
  // a forward running in the thread that holds the runner can take it back: the CPython entry.
  release_interpreter_lock,
};

// Takes the runner's lock as the policy says.
std::unique_lock<std::recursive_mutex> lock_runner(RunnerSlot &slot, LockPolicy policy);

// What the caller of call_runner does while the runner's lock is held, and where the outputs go.
class RunnerCallParty {
public:
  virtual ~RunnerCallParty() = default;
  // Under the runner's lock, just before gf_runner_call. Must not throw.
  virtual void locked() noexcept {}
  // Under the runner's lock, just after gf_runner_call returned status. Must not throw.
  virtual void called(gf_status status) noexcept { (void)status; }
  // After a call that succeeded: room for count outputs, then each output in order.
  virtual void reserve(size_t count) = 0;
  virtual void add(at::Tensor output) = 0;
};

// Where slot's next call_runner says which entry served it, when that call is given no
// options.served: the CPython entry's dispatched path, which reaches the runner through
// graphed::forward (whose schema cannot carry it), sets this around its operator call while it
// holds the runner's lock; call_runner takes it under the lock, so the forward's own calls of the
// runner never see it. where->user stays NULL when the kernel is not reached (a mode answered the
// call) or the call ran eager.
class ServedEntryWanted {
public:
  ServedEntryWanted(RunnerSlot &slot, gf_served_entry *where);
  ~ServedEntryWanted();
  ServedEntryWanted(const ServedEntryWanted &) = delete;
  ServedEntryWanted &operator=(const ServedEntryWanted &) = delete;

private:
  RunnerSlot &slot_;
  gf_served_entry *outer_;
};

// One gf_runner_call of slot's runner. inputs holds a borrowed descriptor of each input tensor
// (its handle the caller's at::Tensor, which passed unsupported_tensor_reason); call_runner
// replaces those the core cannot read as they are by descriptors of copies, which live until it
// returns: dense copies of strided or lazily conjugated views (a forward's in-place write to one
// is copied back), and, for a runner that stages CPU inputs (RunnerSlot::stages_cpu_inputs), CPU
// tensors copied to the runner's device (nothing copied back). It sets options.mutated_inputs
// itself. Throws what torch throws while
// densifying or writing back; no output handle leaks either way.
gf_status call_runner(RunnerSlot &slot, const void *key, size_t key_length, gf_tensor *inputs,
                      size_t input_count, const gf_tensor *keep_alive, size_t keep_alive_count,
                      gf_call_options options, LockPolicy policy, RunnerCallParty &party,
                      gf_error *err);

} // namespace graphed
