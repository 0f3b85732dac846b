/* How a graph pool grows: by torch's expandable segments, switched on while graphed allocates into
 * its pools and off again after, so that a pool's graphs share one growing range of memory in
 * whatever order their shapes arrive (see gf_cuda_pool_growth.cpp for the figures and the rules:
 * the user's own allocator settings win, and a distributed job keeps plain segments). C++ only:
 * the torch half of the CUDA backend calls it. */
#ifndef GF_CUDA_POOL_GROWTH_H
#define GF_CUDA_POOL_GROWTH_H

#include <string>

namespace graphed::cuda {

// Called where a warm-up or capture begins to allocate into a graph pool (under the pool's lock)
// and where it ends; nested and concurrent windows are counted, so the setting is put back when
// the last one ends. Never throw: where the setting cannot be changed, the pool grows by plain
// segments as before.
void pool_growth_begin() noexcept;
void pool_growth_end() noexcept;

// The rule alone (no torch, for the tests): whether a window switches expandable segments on,
// given the allocator settings as torch reports them ("" where the user set none), whether torch
// has expandable segments on already, and an environment lookup (getenv).
bool pool_growth_wanted(const std::string &settings, bool expandable_already,
                        const char *(*environment)(const char *name)) noexcept;

// What a window writes into torch's settings, and what a window's end compares them with: a
// setting found changed there is the user's, left as it is.
inline constexpr const char *kPoolGrowthSettings = "expandable_segments:True";

} // namespace graphed::cuda

#endif
