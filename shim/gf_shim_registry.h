// The tables of live runners and of memory pools, each addressed from Python and from the
// dispatcher by a small integer id. Each runner has its own recursive mutex: calls into one runner
// are serialised (a forward may call back into graphed through another runner, or, eagerly, the
// same one). A memory pool (graphed.MemoryPool) is a handle its backend made, which the runners
// of that backend are made on.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <mutex>
#include <string>

extern "C" {
#include "gf_backend.h"
#include "gf_runner.h"
}

namespace graphed {

struct RunnerCall;
struct HostContext;

struct RunnerSlot {
  gf_runner *runner = nullptr;
  std::recursive_mutex mutex;
  std::string name;
  c10::Device device{c10::kCPU}; // the runner's, for errors in torch's words
  // The runner's share of the call in flight (gf_shim_host.h), owned by its host context: lives
  // as long as the runner, which the slot destroys last. Used under `mutex` only.
  RunnerCall *call = nullptr;
  // The runner's host context (gf_shim_host.h), owned by the runner likewise: where
  // attach_direct_hooks gives a GraphedForward's runner its forward. Used under `mutex` only.
  HostContext *host = nullptr;
  // cpu_inputs="to_device": a CPU input of a runner on another device is copied there for the
  // call (gf_shim_call.cpp), as a forward that moves it itself would; none is copied back.
  bool stages_cpu_inputs = false;
  ~RunnerSlot() { gf_runner_destroy(runner); }
};

// Takes ownership of runner, whose host context is `host`; returns its id.
int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device,
                        HostContext *host, bool stages_cpu_inputs);

// The phase of the innermost forward a live runner runs on the calling thread (GF_PHASE_EAGER
// when none does): what the operator graphed::forward_phase answers model code with, which names
// no runner. Walks the live runners: for model code, never on a call's path.
gf_forward_phase phase_of_forward_on_this_thread();

// The slot of a live runner, or a ValueError naming the id.
std::shared_ptr<RunnerSlot> find_runner(int64_t id);

// Destroys a runner (its graphs and pools); later use of the id is a ValueError. False when no
// runner has that id.
bool unregister_runner(int64_t id);

// A graph memory pool runners share: the handle a backend's pool_create made (gf_backend.h) and
// that backend, which releases it with the slot (runners made on it keep the pool alive
// themselves); or no handle where the backend has no pools on the device (the pool then only
// names a group). The slot names no backend: a runner shares the handle when its backend is the
// one that made it.
struct PoolSlot {
  c10::Device device{c10::kCPU};       // its index resolved when the pool was made without one
  const gf_backend *backend = nullptr; // the one that made handle; NULL without a handle
  void *handle = nullptr;
  PoolSlot() = default;
  PoolSlot(const PoolSlot &) = delete;
  PoolSlot &operator=(const PoolSlot &) = delete;
  ~PoolSlot() {
    if (handle != nullptr && backend->pool_release != nullptr) {
      backend->pool_release(backend->context, handle);
    }
  }
};

// A new pool on device, made by the backend chosen at load, which a runner on the device gets
// unless it names another (a ValueError when that backend fails to make one); returns its id.
int64_t create_pool(c10::Device device);

// The slot of a live pool that a runner on runner_device may share, or a ValueError naming the id
// (no such pool) or both devices (a pool on another device, where its memory is of no use).
std::shared_ptr<PoolSlot> find_pool(int64_t id, c10::Device runner_device);

// Drops the table's hold on a pool; runners made on it keep theirs. False when no pool has that
// id.
bool release_pool(int64_t id);

} // namespace graphed
