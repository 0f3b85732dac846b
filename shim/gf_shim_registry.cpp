// The runner table (see gf_shim_registry.h).
#include "gf_shim_registry.h"

#include "gf_torch_errors.h"

#include <c10/util/Exception.h>

#include <unordered_map>

namespace graphed {

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<RunnerSlot>> slots;
  int64_t next_id = 1;
};

Registry &registry() {
  // Leaked on purpose: runners may still be released by Python objects during interpreter exit,
  // after static destructors would have run.
  static Registry *instance = new Registry();
  return *instance;
}

} // namespace

int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device) {
  auto slot = std::make_shared<RunnerSlot>();
  slot->runner = runner;
  slot->name = name;
  slot->device = device;
  Registry &table = registry();
  std::lock_guard<std::mutex> guard(table.mutex);
  int64_t id = table.next_id++;
  table.slots.emplace(id, std::move(slot));
  return id;
}

std::shared_ptr<RunnerSlot> find_runner(int64_t id) {
  Registry &table = registry();
  std::lock_guard<std::mutex> guard(table.mutex);
  auto found = table.slots.find(id);
  if (found == table.slots.end()) {
    TORCH_CHECK_VALUE(false, format_message("graphed: no runner with id %lld (it was destroyed, "
                                            "or never created)",
                                            static_cast<long long>(id)));
  }
  return found->second;
}

bool unregister_runner(int64_t id) {
  std::shared_ptr<RunnerSlot> slot;
  {
    Registry &table = registry();
    std::lock_guard<std::mutex> guard(table.mutex);
    auto found = table.slots.find(id);
    if (found == table.slots.end()) {
      return false;
    }
    slot = std::move(found->second);
    table.slots.erase(found);
  }
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  // The runner is destroyed when the last holder lets go of the slot.
  return true;
}

} // namespace graphed
