// The runner and pool tables (see gf_shim_registry.h).
#include "gf_shim_registry.h"

#include "gf_shim_host.h"
#include "gf_torch_errors.h"

extern "C" {
#include "gf_backend_registry.h"
}

#include <c10/core/impl/DeviceGuardImplInterface.h>
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

int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device,
                        HostContext *host, bool stages_cpu_inputs) {
  auto slot = std::make_shared<RunnerSlot>();
  slot->runner = runner;
  slot->name = name;
  slot->device = device;
  slot->host = host;
  slot->call = &host->call;
  slot->stages_cpu_inputs = stages_cpu_inputs;
  return locked([&](Registry &table) { return table.runners.add(std::move(slot)); });
}

gf_forward_phase phase_of_forward_on_this_thread() {
  const std::thread::id here = std::this_thread::get_id();
  return locked([&](Registry &table) {
    gf_forward_phase phase = GF_PHASE_EAGER;
    uint64_t latest = 0;
    for (const auto &[id, slot] : table.runners.slots) {
      const RunnerCall &call = *slot->call;
      const uint64_t order = call.forward_order.load(std::memory_order_relaxed);
      if (order > latest && call.forward_thread.load(std::memory_order_relaxed) == here) {
        latest = order;
        phase = call.phase; // written by this thread, which runs that forward
      }
    }
    return phase;
  });
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

namespace {

// The device with the current index of its kind where it names none, as graphed.MemoryPool
// resolves its device (_device_hooks.resolve_device): a pool made on "cuda" belongs to the device
// current then, a runner made on "cuda" to the one current at its creation. As it is where torch
// has no device guard for the kind or cannot say (no driver): the index is then not compared.
c10::Device with_current_index(c10::Device device) {
  if (device.has_index() || !c10::impl::hasDeviceGuardImpl(device.type())) {
    return device;
  }
  try {
    const c10::Device current = c10::impl::getDeviceGuardImpl(device.type())->getDevice();
    return current.type() == device.type() ? current : device;
  } catch (...) {
    return device;
  }
}

} // namespace

int64_t create_pool(c10::Device device) {
  auto slot = std::make_shared<PoolSlot>();
  slot->device = with_current_index(device);
  const gf_backend *backend = gf_backend_current();
  if (backend->pool_create != nullptr) {
    gf_error err{};
    const int index = slot->device.has_index() ? slot->device.index() : -1;
    if (backend->pool_create(backend->context, static_cast<int>(device.type()), index,
                             &slot->handle, &err) != GF_OK) {
      TORCH_CHECK_VALUE(false, err.message);
    }
    slot->backend = slot->handle != nullptr ? backend : nullptr;
  }
  return locked([&](Registry &table) { return table.pools.add(std::move(slot)); });
}

// The one place of the rule that a pool serves runners of its own device only.
std::shared_ptr<PoolSlot> find_pool(int64_t id, c10::Device runner_device) {
  std::shared_ptr<PoolSlot> pool =
      locked([&](Registry &table) { return table.pools.find(id, "memory pool", "released"); });
  const c10::Device runner = with_current_index(runner_device);
  const bool same_index =
      !pool->device.has_index() || !runner.has_index() || pool->device.index() == runner.index();
  if (pool->device.type() != runner.type() || !same_index) {
    TORCH_CHECK_VALUE(false, format_message("graphed: the memory pool is on %s, the runner on %s; "
                                            "give runners a pool of their own device",
                                            pool->device.str().c_str(), runner.str().c_str()));
  }
  return pool;
}

bool release_pool(int64_t id) {
  // The table's hold goes when `slot` does, outside the lock.
  std::shared_ptr<PoolSlot> slot = locked([&](Registry &table) { return table.pools.take(id); });
  return slot != nullptr;
}

} // namespace graphed
