// The fixture every runner suite shares, so that a new suite reuses it instead of copying it: a
// runner driven through the recording backend and the malloc host, helpers to make inputs and to
// compute what the fake forward must return, and a TearDown that checks nothing leaked and the
// backend saw a well-formed protocol.
#ifndef GF_RUNNER_FIXTURE_H
#define GF_RUNNER_FIXTURE_H

#include "gf_runner.h"
#include "gf_test_fakes.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

namespace runner_test {

using Events = std::vector<std::string>;
using Values = std::vector<float>;

// Live input tensors: float32 buffers owned here and contiguous borrowed views of them. Moving
// keeps the views valid (the buffers stay where they are); copying would not, so it is deleted.
struct Inputs {
  std::vector<std::vector<float>> buffers;
  std::vector<gf_tensor> views;

  Inputs() = default;
  Inputs(Inputs &&) = default;
  Inputs &operator=(Inputs &&) = default;
  Inputs(const Inputs &) = delete;
  Inputs &operator=(const Inputs &) = delete;
};

// count inputs of the given shape; element e of input k holds seed + 10 k + e / 2.
inline Inputs MakeInputs(size_t count, std::vector<int64_t> sizes, float seed) {
  Inputs inputs;
  int64_t numel = 1;
  for (int64_t size : sizes) {
    numel *= size;
  }
  for (size_t k = 0; k < count; ++k) {
    std::vector<float> buffer(static_cast<size_t>(numel));
    for (int64_t e = 0; e < numel; ++e) {
      buffer[static_cast<size_t>(e)] = seed + 10.0f * static_cast<float>(k) + 0.5f * e;
    }
    inputs.buffers.push_back(std::move(buffer));
  }
  for (auto &buffer : inputs.buffers) {
    inputs.views.push_back(
        gf_fake_view(buffer.data(), static_cast<int>(sizes.size()), sizes.data()));
  }
  return inputs;
}

inline Values ReadFloats(const gf_tensor &t) {
  const float *data = static_cast<const float *>(t.data);
  return Values(data, data + gf_tensor_numel(&t));
}

// What the fake forward computes for output j, written independently of the fake:
// (2 + j) * in0 + in1 + in2 + ... (all inputs here have in0's shape).
inline Values Expected(const std::vector<gf_tensor> &inputs, size_t j = 0) {
  Values out = ReadFloats(inputs[0]);
  for (float &value : out) {
    value *= static_cast<float>(2 + j);
  }
  for (size_t k = 1; k < inputs.size(); ++k) {
    Values in = ReadFloats(inputs[k]);
    for (size_t e = 0; e < out.size(); ++e) {
      out[e] += in[e];
    }
  }
  return out;
}

// What one gf_runner_call returned, read right after the call.
struct Result {
  gf_status status = GF_OK;
  std::string message;
  size_t input_number = 0; // gf_error's: 1 + the input the error is about, 0 for none
  std::vector<Values> values;
  std::vector<void *> data;
  gf_pool *pool = nullptr; // the owned outputs, released by the fixture
};

inline bool Contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

const gf_call_options kDefault = {0, 0, nullptr, nullptr, 0};
const gf_call_options kPinned = {1, 0, nullptr, nullptr, 0};
const gf_call_options kStaticOutputs = {0, 1, nullptr, nullptr, 0};

class Runner : public ::testing::Test {
protected:
  void SetUp() override {
    gf_fake_backend_init(&backend_, &log_);
    gf_fake_host_init(&host_, &log_, &backend_);
    config_.device_type = GF_FAKE_DEVICE_TYPE;
    config_.device_index = 0;
    config_.max_entries = 8;
    config_.warmup_iters = 2;
    config_.enabled = 1;
    config_.hash_fn = nullptr;
  }

  // Every test ends checking that nothing leaked and the backend saw a well-formed protocol.
  void TearDown() override {
    ReleaseResults();
    DestroyRunner();
    EXPECT_EQ(host_.live_handles, 0) << "host handles leaked";
    EXPECT_EQ(host_.bad_releases, 0u) << "a handle was released twice";
    EXPECT_EQ(backend_.live_graphs, 0) << "graphs leaked";
    EXPECT_EQ(backend_.live_states, 0);
    EXPECT_EQ(backend_.protocol_errors, 0u) << backend_.last_protocol_error;
    gf_fake_host_free(&host_);
    gf_fake_log_free(&log_);
  }

  gf_status Create(const gf_backend *backend) {
    gf_host table = gf_fake_host_table(&host_);
    return gf_runner_create(&config_, &table, backend, &runner_, &err_);
  }

  void Create() { ASSERT_EQ(Create(&backend_.table), GF_OK) << err_.message; }

  void DestroyRunner() {
    if (runner_ != nullptr) {
      gf_runner_destroy(runner_);
      runner_ = nullptr;
      EXPECT_EQ(host_.destroyed, 1);
    }
  }

  Result Call(const std::vector<gf_tensor> &inputs, const gf_call_options &options = kDefault,
              const std::string &key = "key", const std::vector<gf_tensor> &keep_alive = {}) {
    results_.emplace_back();
    gf_pool *pool = &results_.back();
    *pool = gf_pool{};
    gf_error err = {};
    Result result;
    result.status = gf_runner_call(runner_, key.data(), key.size(), inputs.data(), inputs.size(),
                                   keep_alive.data(), keep_alive.size(), &options, pool, &err);
    result.message = err.message;
    result.input_number = err.input_number;
    for (size_t i = 0; i < pool->count; ++i) {
      result.values.push_back(ReadFloats(pool->tensors[i]));
      result.data.push_back(pool->tensors[i].data);
    }
    result.pool = pool;
    return result;
  }

  // Calls and checks the call succeeded with the fake forward's single output.
  void CallExpectingCorrect(const Inputs &inputs, const gf_call_options &options = kDefault) {
    Result result = Call(inputs.views, options);
    ASSERT_EQ(result.status, GF_OK) << result.message;
    ASSERT_EQ(result.values.size(), 1u);
    EXPECT_EQ(result.values[0], Expected(inputs.views));
  }

  void ReleaseResults() {
    for (gf_pool &pool : results_) {
      gf_fake_host_release_pool(&host_, &pool);
      gf_pool_free(&pool, nullptr, nullptr);
    }
    results_.clear();
  }

  // Gives back a tensor the test made with gf_fake_host_tensor.
  void ReleaseTensor(const gf_tensor &tensor) {
    gf_pool own = {};
    ASSERT_EQ(gf_pool_add(&own, &tensor, nullptr), GF_OK);
    gf_fake_host_release_pool(&host_, &own);
    gf_pool_free(&own, nullptr, nullptr);
  }

  gf_runner_stats Stats() const {
    gf_runner_stats stats = {};
    gf_runner_get_stats(runner_, &stats);
    return stats;
  }

  std::string Reason() const { return gf_runner_disabled_reason(runner_); }

  Events Log() const {
    Events events;
    for (size_t i = 0; i < log_.count; ++i) {
      events.push_back(log_.events[i]);
    }
    return events;
  }

  void ClearLog() { gf_fake_log_clear(&log_); }

  std::string LastWarning() const {
    return host_.warn_count == 0 ? "" : host_.warnings[host_.warn_count - 1];
  }

  // Backend hooks that touch the device on a replay.
  uint64_t ReplayHookCalls() const {
    return backend_.calls[GF_FAKE_HOOK_COPY_BATCH] + backend_.calls[GF_FAKE_HOOK_LAUNCH];
  }

  void ExpectEagerOnly(const Events &log) {
    EXPECT_EQ(log, Events{"forward"}) << "an eager call touches no backend hook";
  }

  gf_fake_log log_ = {};
  gf_fake_backend backend_ = {};
  gf_fake_host host_ = {};
  gf_runner_config config_ = {};
  gf_runner *runner_ = nullptr;
  gf_error err_ = {};
  std::deque<gf_pool> results_;
};

} // namespace runner_test

#endif // GF_RUNNER_FIXTURE_H
