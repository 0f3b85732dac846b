// The CUDA backend's rule for when graphed switches torch's expandable segments on around its
// warm-ups and captures (backends/cuda/gf_cuda_pool_growth.h): a function of the allocator
// settings and the environment, so it runs without a device. What the switch does to memory is
// measured on a GPU (tests/python/test_memory.py).
#include "gf_cuda_pool_growth.h"

#include <gtest/gtest.h>

#include <cstring>

namespace {

// The environment the rule sees: these variables, nullptr for any other.
const char *world_size = nullptr;
const char *master_addr = nullptr;
const char *rank = nullptr;

const char *lookup(const char *name) {
  if (std::strcmp(name, "WORLD_SIZE") == 0) {
    return world_size;
  }
  if (std::strcmp(name, "MASTER_ADDR") == 0) {
    return master_addr;
  }
  return std::strcmp(name, "RANK") == 0 ? rank : nullptr;
}

class PoolGrowthRule : public ::testing::Test {
protected:
  void SetUp() override { world_size = master_addr = rank = nullptr; }
};

using graphed::cuda::pool_growth_wanted;

TEST_F(PoolGrowthRule, SwitchesOnWhereTheUserSetNothing) {
  EXPECT_TRUE(pool_growth_wanted("", false, lookup));
}

TEST_F(PoolGrowthRule, LeavesAUsersSettingsAlone) {
  EXPECT_FALSE(pool_growth_wanted("expandable_segments:False", false, lookup));
  EXPECT_FALSE(pool_growth_wanted("max_split_size_mb:128", false, lookup));
  EXPECT_FALSE(pool_growth_wanted("expandable_segments:True", true, lookup));
}

TEST_F(PoolGrowthRule, HasNothingToDoWhereExpandableSegmentsAreOnAlready) {
  EXPECT_FALSE(pool_growth_wanted("", true, lookup));
}

TEST_F(PoolGrowthRule, LeavesADistributedJobWithPlainSegments) {
  world_size = "2";
  EXPECT_FALSE(pool_growth_wanted("", false, lookup));
  world_size = nullptr;
  master_addr = "127.0.0.1";
  EXPECT_FALSE(pool_growth_wanted("", false, lookup));
}

TEST_F(PoolGrowthRule, AnEmptyLaunchVariableIsNoDistributedJob) {
  world_size = "";
  rank = "0"; // only WORLD_SIZE and MASTER_ADDR say so
  EXPECT_TRUE(pool_growth_wanted("", false, lookup));
}

TEST_F(PoolGrowthRule, WritesTheSettingItComparesWithAtTheEnd) {
  EXPECT_STREQ(graphed::cuda::kPoolGrowthSettings, "expandable_segments:True");
}

} // namespace
