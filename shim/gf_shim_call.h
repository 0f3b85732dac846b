// One runner call on the torch side, shared by the graphed::forward operator's kernel
// (gf_shim_ops.cpp) and the CPython entry point (pyext/gf_fastcall_torch.cpp), so that the rules
// of a call are written once: inputs the core cannot read as they are go in as dense copies,
// whose in-place writes are copied back after the call; the runner's lock is held around the core
// call only; every output handle the core made is released, on success and failure alike. The two
// callers differ in how they wait for the lock and where the outputs go.
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

// How the CPython entry's dispatched path (graphed::forward called through the dispatcher, so that
// FakeTensor and other modes see it, with the runner's lock held) learns which entry served the
// call: while a ServedEntryRequest lives on this thread, the operator's kernel gives the runner's
// next call on this thread gf_call_options.entry_user = where (and takes the request, so that the
// forward's own calls do not see it). *where stays NULL when the kernel is not reached (a mode
// answered the call) or the call ran eager.
class ServedEntryRequest {
public:
  ServedEntryRequest(int64_t runner_id, void ***where);
  ~ServedEntryRequest();
  ServedEntryRequest(const ServedEntryRequest &) = delete;
  ServedEntryRequest &operator=(const ServedEntryRequest &) = delete;

private:
  int64_t outer_runner_id_;
  void ***outer_where_;
};

// The request for this runner on this thread, taken (NULL when there is none).
void ***take_served_entry_request(int64_t runner_id);

// One gf_runner_call of slot's runner. inputs holds a borrowed descriptor of each input tensor
// (its handle the caller's at::Tensor, which passed unsupported_tensor_reason); call_runner
// replaces those the core cannot read as they are by descriptors of dense copies, which live
// until it returns, and sets options.mutated_inputs itself. Throws what torch throws while
// densifying or writing back; no output handle leaks either way.
gf_status call_runner(RunnerSlot &slot, const void *key, size_t key_length, gf_tensor *inputs,
                      size_t input_count, const gf_tensor *keep_alive, size_t keep_alive_count,
                      gf_call_options options, LockPolicy policy, RunnerCallParty &party,
                      gf_error *err);

} // namespace graphed
