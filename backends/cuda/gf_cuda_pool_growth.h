/* How a graph pool grows: by torch's expandable segments, switched on while graphed allocates into
 * its pools and off again after, so that a pool's graphs share one growing range of memory in
 * whatever order their shapes arrive (see gf_cuda_pool_growth.cpp for the figures and the rule on
 * the user's own allocator settings). C++ only: the torch half of the CUDA backend calls it. */
#ifndef GF_CUDA_POOL_GROWTH_H
#define GF_CUDA_POOL_GROWTH_H

namespace graphed::cuda {

// Called where a warm-up or capture begins to allocate into a graph pool (under the pool's lock)
// and where it ends; nested and concurrent windows are counted, so the setting is put back when
// the last one ends. Never throw: where the setting cannot be changed, the pool grows by plain
// segments as before.
void pool_growth_begin() noexcept;
void pool_growth_end() noexcept;

} // namespace graphed::cuda

#endif
