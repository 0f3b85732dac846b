// The runner and pool tables (see gf_shim_registry.h).
#include "gf_shim_registry.h"

#include "gf_torch_errors.h"

#ifdef GF_WITH_CUDA
extern "C" {
#include "gf_cuda_backend.h"
}
#endif

#include <c10/util/Exception.h>

#include <unordered_map>

namespace graphed {

namespace {

// Live slots of one kind by id; ids are never reused.
template <typename Slot> struct Table {
  std::unordered_map<int64_t, std::shared_ptr<Slot>> slots;
  int64_t next_id = 1;

  int64_t add(std::shared_ptr<Slot> slot) {
    int64_t id = next_id++;
    slots.emplace(id, std::move(slot));
    return id;
  }

  // The slot, or a ValueError saying what became of it (`gone`: "destroyed", "released").
  std::shared_ptr<Slot> find(int64_t id, const char *what, const char *gone) const {
    auto found = slots.find(id);
    if (found == slots.end()) {
      TORCH_CHECK_VALUE(false, format_message("graphed: no %s with id %lld (it was %s, or never "
                                              "created)",
                                              what, static_cast<long long>(id), gone));
    }
    return found->second;
  }

  // The slot taken out of the table; empty when no slot has that id.
  std::shared_ptr<Slot> take(int64_t id) {
    auto found = slots.find(id);
    if (found == slots.end()) {
      return nullptr;
    }
    std::shared_ptr<Slot> slot = std::move(found->second);
    slots.erase(found);
    return slot;
  }
};

struct Registry {
  std::mutex mutex;
  Table<RunnerSlot> runners;
  Table<PoolSlot> pools;
};

Registry &registry() {
  // Leaked on purpose: runners may still be released by Python objects during interpreter exit,
  // after static destructors would have run.
  static Registry *instance = new Registry();
  return *instance;
}

// Runs use on the registry under its lock and returns what it returns.
template <typename Use> auto locked(Use use) {
  Registry &table = registry();
  std::lock_guard<std::mutex> guard(table.mutex);
  return use(table);
}

} // namespace

int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device) {
  auto slot = std::make_shared<RunnerSlot>();
  slot->runner = runner;
  slot->name = name;
  slot->device = device;
  return locked([&](Registry &table) { return table.runners.add(std::move(slot)); });
}

std::shared_ptr<RunnerSlot> find_runner(int64_t id) {
  return locked([&](Registry &table) { return table.runners.find(id, "runner", "destroyed"); });
}

bool unregister_runner(int64_t id) {
  std::shared_ptr<RunnerSlot> slot =
      locked([&](Registry &table) { return table.runners.take(id); });
  if (slot == nullptr) {
    return false;
  }
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  // The runner is destroyed when the last holder lets go of the slot.
  return true;
}

int64_t create_pool(c10::Device device) {
  auto slot = std::make_shared<PoolSlot>();
  slot->device = device;
#ifdef GF_WITH_CUDA
  if (device.is_cuda()) {
    gf_error err{};
    if (gf_cuda_backend_with_pool(device.has_index() ? device.index() : -1, &slot->table, &err) !=
        GF_OK) {
      TORCH_CHECK_VALUE(false, err.message);
    }
    slot->release_table = gf_cuda_backend_release_pool;
  }
#endif
  return locked([&](Registry &table) { return table.pools.add(std::move(slot)); });
}

std::shared_ptr<PoolSlot> find_pool(int64_t id) {
  return locked([&](Registry &table) { return table.pools.find(id, "memory pool", "released"); });
}

bool release_pool(int64_t id) {
  // The table's hold goes when `slot` does, outside the lock.
  std::shared_ptr<PoolSlot> slot = locked([&](Registry &table) { return table.pools.take(id); });
  return slot != nullptr;
}

} // namespace graphed
