// What a graph reads besides its pools, as the torch host keeps it for the core
// (gf_forward_report.inventory, Note [A graph's externals] in ops/gf_runner.c): the storage of each
// external tensor held weakly, with the address its capture read, and the pinned host buffers
// the capture's staged copies read, held for as long as the graph lives.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace graphed {

struct CaptureInventory {
  struct External {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void *data; // where the capture read it
    std::string name; // how graphed names it to people (the frame that first read it)
  };
  std::vector<External> externals;
  std::vector<at::Tensor> staged; // pinned host buffers the graph's copies read
};

// 1 when an external was freed or its storage moved since the capture (its data elsewhere), with
// *which naming it (valid as long as the inventory); 0 otherwise. Two loads per external.
int externals_freed(const CaptureInventory &inventory, const char **which) noexcept;

} // namespace graphed
