// The torch-side runner call both entry points share (see gf_shim_call.h).
#include "gf_shim_call.h"

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

// The dispatched path's request on this thread (see ServedEntryRequest).
thread_local int64_t requested_runner_id = -1;
thread_local void ***requested_where = nullptr;

} // namespace

ServedEntryRequest::ServedEntryRequest(int64_t runner_id, void ***where)
    : outer_runner_id_(requested_runner_id), outer_where_(requested_where) {
  *where = nullptr;
  requested_runner_id = runner_id;
  requested_where = where;
}

ServedEntryRequest::~ServedEntryRequest() {
  requested_runner_id = outer_runner_id_;
  requested_where = outer_where_;
}

void ***take_served_entry_request(int64_t runner_id) {
  if (requested_where == nullptr || requested_runner_id != runner_id) {
    return nullptr;
  }
  return std::exchange(requested_where, nullptr);
}

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
    if (needs_dense_copy(tensor)) {
      densified.push_back({i, &tensor});
      inputs[i] = describe_dense(tensor, dense, input_count);
    }
  }
  std::vector<unsigned char> mutated(densified.empty() ? 0 : input_count);
  options.mutated_inputs = mutated.empty() ? nullptr : mutated.data();
  OutputHandles outputs;
  gf_status status;
  {
    std::unique_lock<std::recursive_mutex> guard = lock_runner(slot, policy);
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
