// The torch-side runner call both entry points share (see gf_shim_call.h).
#include "gf_shim_call.h"

#include "gf_shim_host.h"
#include "gf_shim_interpreter_lock.h"
#include "gf_shim_tensor.h"

#include <utility>
#include <vector>

namespace graphed {

namespace {

void lock_waiting(void *lock) noexcept {
  static_cast<std::unique_lock<std::recursive_mutex> *>(lock)->lock();
}

// The outputs the core appends: moved on to the party after a call that succeeded, else (and
// whatever was not moved when something threw) released here.
class OutputHandles {
public:
  OutputHandles() = default;
  ~OutputHandles() {
    for (size_t i = 0; i < results_.count; ++i) {
      if (results_.tensors[i].handle != nullptr) {
        release_handle(results_.tensors[i].handle);
      }
    }
    gf_pool_free(&results_, nullptr, nullptr);
  }
  OutputHandles(const OutputHandles &) = delete;
  OutputHandles &operator=(const OutputHandles &) = delete;

  gf_pool *pool() { return &results_; }

  void hand_to(RunnerCallParty &party) {
    party.reserve(results_.count);
    for (size_t i = 0; i < results_.count; ++i) {
      void *handle = results_.tensors[i].handle;
      results_.tensors[i].handle = nullptr;
      party.add(take_handle(handle));
    }
  }

private:
  gf_pool results_{};
};

// cpu_inputs="to_device": the CPU inputs of a call, copied to the runner's device (contiguous, as
// the core reads them); staged keeps the copies until the call returns. Nothing is copied back: a
// forward that moves such an input itself writes to its own copy too.
void stage_cpu_inputs(const RunnerSlot &slot, gf_tensor *inputs, size_t input_count,
                      std::vector<at::Tensor> &staged) {
  for (size_t i = 0; i < input_count; ++i) {
    const at::Tensor &tensor = tensor_of_handle(inputs[i].handle);
    if (tensor.device().is_cpu()) {
      if (staged.empty()) {
        staged.reserve(input_count); // the descriptors borrow the copies: no reallocation
      }
      staged.push_back(tensor.resolve_conj().resolve_neg().to(slot.device).contiguous());
      inputs[i] = describe_tensor(staged.back(), false);
      inputs[i].handle = &staged.back(); // borrowed, as the caller's descriptors are
    }
  }
}

} // namespace

ServedEntryWanted::ServedEntryWanted(RunnerSlot &slot, gf_served_entry *where)
    : slot_(slot), outer_(slot.call->served_request) {
  where->user = nullptr;
  slot.call->served_request = where;
}

ServedEntryWanted::~ServedEntryWanted() { slot_.call->served_request = outer_; }

std::unique_lock<std::recursive_mutex> lock_runner(RunnerSlot &slot, LockPolicy policy) {
  std::unique_lock<std::recursive_mutex> lock(slot.mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (policy == LockPolicy::release_interpreter_lock) {
      run_without_interpreter_lock(lock_waiting, &lock);
    } else {
      lock.lock();
    }
  }
  return lock;
}

gf_status call_runner(RunnerSlot &slot, const void *key, size_t key_length, gf_tensor *inputs,
                      size_t input_count, const gf_tensor *keep_alive, size_t keep_alive_count,
                      gf_call_options options, LockPolicy policy, RunnerCallParty &party,
                      gf_error *err) {
  // Only an input the core cannot read as it is (a strided or lazily conjugated view) is
  // described again, as its dense copy; a forward's in-place write to it is copied back below.
  std::vector<at::Tensor> dense;
  std::vector<DenseInput> densified;
  for (size_t i = 0; i < input_count; ++i) {
    const at::Tensor &tensor = tensor_of_handle(inputs[i].handle);
    if (slot.stages_cpu_inputs && tensor.device().is_cpu()) {
      continue; // staged below, or given to an eager run as it is
    }
    if (needs_dense_copy(tensor)) {
      densified.push_back({i, &tensor});
      inputs[i] = describe_dense(tensor, dense, input_count);
    }
  }
  std::vector<unsigned char> mutated(densified.empty() ? 0 : input_count);
  options.mutated_inputs = mutated.empty() ? nullptr : mutated.data();
  OutputHandles outputs;
  std::vector<at::Tensor> staged;
  gf_status status;
  {
    std::unique_lock<std::recursive_mutex> guard = lock_runner(slot, policy);
    if (options.served == nullptr) {
      options.served = std::exchange(slot.call->served_request, nullptr);
    }
    // Only a runner that may replay stages: a disabled one runs the forward eagerly, which gets
    // the CPU tensors, as without graphed.
    if (slot.stages_cpu_inputs && gf_runner_disabled_cause(slot.runner) == GF_CAUSE_NONE) {
      stage_cpu_inputs(slot, inputs, input_count, staged);
    }
    party.locked();
    status = gf_runner_call(slot.runner, key, key_length, inputs, input_count, keep_alive,
                            keep_alive_count, &options, outputs.pool(), err);
    party.called(status);
  }
  if (status != GF_OK) {
    return status; // the outputs the core appended are released on the way out
  }
  if (!mutated.empty()) {
    write_back_dense(densified, inputs, mutated.data());
  }
  outputs.hand_to(party);
  return GF_OK;
}

} // namespace graphed
