// The tables of live runners and of memory pools, each addressed from Python and from the
// dispatcher by a small integer id. Each runner has its own recursive mutex: calls into one runner
// are serialised (a forward may call back into graphed through another runner, or, eagerly, the
// same one). A memory pool (graphed.MemoryPool) is the backend table its runners are made on.
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

struct RunnerSlot {
  gf_runner *runner = nullptr;
  std::recursive_mutex mutex;
  std::string name;
  c10::Device device{c10::kCPU}; // the runner's, for errors in torch's words
  ~RunnerSlot() { gf_runner_destroy(runner); }
};

// Takes ownership of runner; returns its id.
int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device);

// The slot of a live runner, or a ValueError naming the id.
std::shared_ptr<RunnerSlot> find_runner(int64_t id);

// Destroys a runner (its graphs and pools); later use of the id is a ValueError. False when no
// runner has that id.
bool unregister_runner(int64_t id);

// A graph memory pool runners share: the backend table whose runners allocate their graphs from
// one pool (released with the slot; runners made on it keep the pool alive themselves), or NULL
// where the device's backend has no pools to share (the pool then only names a group).
struct PoolSlot {
  c10::Device device{c10::kCPU};
  const gf_backend *table = nullptr;
  void (*release_table)(const gf_backend *table) = nullptr;
  PoolSlot() = default;
  PoolSlot(const PoolSlot &) = delete;
  PoolSlot &operator=(const PoolSlot &) = delete;
  ~PoolSlot() {
    if (release_table != nullptr) {
      release_table(table);
    }
  }
};

// A new pool on device (a ValueError when its backend cannot make one); returns its id.
int64_t create_pool(c10::Device device);

// The slot of a live pool, or a ValueError naming the id.
std::shared_ptr<PoolSlot> find_pool(int64_t id);

// Drops the table's hold on a pool; runners made on it keep theirs. False when no pool has that
// id.
bool release_pool(int64_t id);

} // namespace graphed
