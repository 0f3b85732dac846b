// The check before a replay that a graph's externals are still where its capture read them
// (gf_shim_inventory.h): on the hit path, so it reads two words per external and allocates nothing.
#include "gf_shim_inventory.h"

namespace graphed {

int externals_freed(const CaptureInventory &inventory, const char **which) noexcept {
  for (const CaptureInventory::External &external : inventory.externals) {
    // A StorageImpl whose last strong reference went stays allocated while weak ones remain, its
    // data released: reading its data pointer then is safe, and says nullptr.
    const c10::StorageImpl *storage = external.storage._unsafe_get_target();
    if (external.storage.expired() || storage->data() != external.data) {
      *which = external.name.c_str();
      return 1;
    }
  }
  return 0;
}

} // namespace graphed
