// Tests of static inputs shared between the entries of one runner (gf_capture.c,
// gf_runner_share_static_inputs): entries that take inputs of the same dtype and shape at the same
// position hold one buffer, counted once in pool_bytes and reported as shared_input_bytes; every
// replay still computes from its own call's inputs (also alternating, and with in-place writes);
// evicting the entry that made a buffer leaves it to the one that shares it; an entry captured
// without a warm-up, or with inputs of another shape, shares nothing; and gf_pool_overlaps, which
// keeps entries whose outputs alias their inputs out of the sharing.
#include "gf_pool.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using namespace runner_test;

constexpr int64_t kFloat = 4;

TEST_F(Runner, EntriesWithInputsOfOneShapeShareTheirStaticBuffers) {
  Create();
  Inputs first = MakeInputs(2, {4}, 1.0f);
  Inputs second = MakeInputs(2, {4}, 7.0f);
  ASSERT_EQ(Call(first.views, kDefault, "a").values[0], Expected(first.views));
  ASSERT_EQ(Call(second.views, kDefault, "b").values[0], Expected(second.views));
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 2u);
  EXPECT_EQ(stats.shared_input_bytes, 2 * 4 * kFloat);
  // One set of input buffers and each entry's own output.
  EXPECT_EQ(stats.pool_bytes, 2 * 4 * kFloat + 2 * 4 * kFloat);
  // Replays alternate between the entries: each copies its own inputs in first.
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(Call(first.views, kDefault, "a").values[0], Expected(first.views));
    EXPECT_EQ(Call(second.views, kDefault, "b").values[0], Expected(second.views));
  }
}

TEST_F(Runner, EntriesReportTheInputBytesTheyShare) {
  Create();
  Inputs inputs = MakeInputs(1, {6}, 1.0f);
  Call(inputs.views, kDefault, "a");
  Call(inputs.views, kDefault, "b");
  std::vector<int64_t> shared;
  gf_runner_visit_entries(
      runner_,
      [](void *context, const gf_entry_info *info) {
        static_cast<std::vector<int64_t> *>(context)->push_back(info->shared_input_bytes);
      },
      &shared);
  EXPECT_EQ(shared, (std::vector<int64_t>{6 * kFloat, 6 * kFloat}));
}

TEST_F(Runner, InputsOfAnotherShapeAreNotShared) {
  Create();
  Inputs small = MakeInputs(1, {4}, 1.0f);
  Inputs large = MakeInputs(1, {8}, 1.0f);
  Call(small.views, kDefault, "a");
  Call(large.views, kDefault, "a");
  EXPECT_EQ(Stats().shared_input_bytes, 0);
  EXPECT_EQ(Stats().pool_bytes, 2 * 4 * kFloat + 2 * 8 * kFloat);
}

TEST_F(Runner, EvictingTheEntryThatMadeABufferLeavesItToTheOneSharingIt) {
  config_.max_entries = 2;
  Create();
  Inputs second = MakeInputs(1, {4}, 5.0f);
  Call(MakeInputs(1, {4}, 1.0f).views, kDefault, "a");
  Call(second.views, kDefault, "b");
  Call(MakeInputs(1, {3}, 2.0f).views, kDefault, "c"); // evicts "a", whose buffer "b" holds too
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.shared_input_bytes, 0);
  EXPECT_EQ(stats.pool_bytes, 2 * 4 * kFloat + 2 * 3 * kFloat);
  EXPECT_EQ(Call(second.views, kDefault, "b").values[0], Expected(second.views));
  gf_runner_reset(runner_);
  EXPECT_EQ(Stats().pool_bytes, 0);
}

TEST_F(Runner, AnEntryCapturedWithoutAWarmUpSharesNothing) {
  config_.warmup_iters = 0; // the first capture runs the sync probe alone, later ones nothing
  Create();
  Inputs first = MakeInputs(1, {4}, 1.0f);
  Inputs second = MakeInputs(1, {4}, 3.0f);
  Call(first.views, kDefault, "a");
  EXPECT_EQ(Call(second.views, kDefault, "b").values[0], Expected(second.views));
  EXPECT_EQ(Stats().shared_input_bytes, 0);
}

TEST_F(Runner, InPlaceWritesReachEachCallersTensorThroughASharedBuffer) {
  host_.mutate_input = 0;
  Create();
  Inputs first = MakeInputs(1, {4}, 1.0f);
  Inputs second = MakeInputs(1, {4}, 9.0f);
  Call(first.views, kDefault, "a");
  Call(second.views, kDefault, "b");
  ASSERT_EQ(Stats().shared_input_bytes, 4 * kFloat);
  Values first_before = ReadFloats(first.views[0]);
  Values second_before = ReadFloats(second.views[0]);
  Call(first.views, kDefault, "a");
  Call(second.views, kDefault, "b");
  for (size_t e = 0; e < first_before.size(); ++e) {
    EXPECT_EQ(ReadFloats(first.views[0])[e], first_before[e] + 1.0f);
    EXPECT_EQ(ReadFloats(second.views[0])[e], second_before[e] + 1.0f);
  }
}

TEST(PoolOverlaps, ViewsOverlapByTheBytesTheirStridesReach) {
  std::vector<float> memory(16);
  const int64_t four[] = {4};
  gf_tensor head = gf_fake_view(memory.data(), 1, four);
  gf_tensor tail = gf_fake_view(memory.data() + 4, 1, four);
  gf_tensor strided = gf_fake_view(memory.data(), 1, four);
  strided.strides[0] = 2; // elements 0, 2, 4, 6: reaches into tail
  const int64_t none[] = {0};
  gf_tensor empty = gf_fake_view(memory.data(), 1, none);
  gf_pool a = {};
  gf_pool b = {};
  ASSERT_EQ(gf_pool_add(&a, &head, nullptr), GF_OK);
  ASSERT_EQ(gf_pool_add(&b, &tail, nullptr), GF_OK);
  EXPECT_EQ(gf_pool_overlaps(&a, &b), 0);
  a.tensors[0] = strided;
  EXPECT_EQ(gf_pool_overlaps(&a, &b), 1);
  a.tensors[0] = empty;
  EXPECT_EQ(gf_pool_overlaps(&a, &b), 0);
  gf_pool_free(&a, nullptr, nullptr);
  gf_pool_free(&b, nullptr, nullptr);
}

} // namespace
