// Tests for gf_signature: which differences between two calls make different signatures (and so
// different graphs), which do not, and that a hash collision never merges two signatures.
#include "gf_cache.h"
#include "gf_pool.h"
#include "gf_signature.h"
#include "gf_test_fakes.h"

#include <gtest/gtest.h>

#include <cstdint>

#include <string>
#include <vector>

namespace {

uint64_t ConstantHash(const unsigned char *, size_t) { return 42; }

// A borrowed float32 view of the given shape; signatures never read the data.
gf_tensor Tensor(std::vector<int64_t> sizes) {
  return gf_fake_view(nullptr, static_cast<int>(sizes.size()), sizes.data());
}

// A signature that frees itself.
struct Signature {
  gf_signature sig = {};
  Signature() = default;
  Signature(const Signature &) = delete;
  Signature &operator=(const Signature &) = delete;
  ~Signature() { gf_signature_free(&sig); }

  gf_status Build(const std::string &key, const std::vector<gf_tensor> &tensors,
                  gf_hash_fn hash_fn = nullptr, gf_error *err = nullptr) {
    return gf_signature_build(&sig, key.data(), key.size(), tensors.data(), tensors.size(), hash_fn,
                              err);
  }
  std::vector<unsigned char> Bytes() const {
    return std::vector<unsigned char>(sig.bytes, sig.bytes + sig.length);
  }
};

// Builds two signatures and says whether they are equal; also checks equal ones share bytes+hash.
bool SameSignature(const std::string &key_a, const std::vector<gf_tensor> &a,
                   const std::string &key_b, const std::vector<gf_tensor> &b) {
  Signature first;
  Signature second;
  EXPECT_EQ(first.Build(key_a, a), GF_OK);
  EXPECT_EQ(second.Build(key_b, b), GF_OK);
  bool equal = gf_signature_equal(&first.sig, &second.sig) != 0;
  if (equal) {
    EXPECT_EQ(first.Bytes(), second.Bytes());
    EXPECT_EQ(first.sig.hash, second.sig.hash);
  }
  return equal;
}

TEST(Signature, EqualInputsGiveEqualBytesAndHash) {
  Signature first;
  Signature second;
  ASSERT_EQ(first.Build("key", {Tensor({2, 3}), Tensor({4})}), GF_OK);
  ASSERT_EQ(second.Build("key", {Tensor({2, 3}), Tensor({4})}), GF_OK);
  EXPECT_TRUE(gf_signature_equal(&first.sig, &second.sig));
  EXPECT_EQ(first.Bytes(), second.Bytes());
  EXPECT_EQ(first.sig.hash, second.sig.hash);
  EXPECT_EQ(first.sig.hash, gf_signature_default_hash(first.sig.bytes, first.sig.length));
}

TEST(Signature, DataAddressDoesNotMatter) {
  float a[6] = {};
  float b[6] = {1, 2, 3, 4, 5, 6};
  int64_t sizes[2] = {2, 3};
  EXPECT_TRUE(SameSignature("k", {gf_fake_view(a, 2, sizes)}, "k", {gf_fake_view(b, 2, sizes)}));
}

TEST(Signature, DifferentKeyBytesDiffer) {
  EXPECT_FALSE(SameSignature("key-a", {Tensor({2})}, "key-b", {Tensor({2})}));
  EXPECT_FALSE(SameSignature("key", {Tensor({2})}, "key2", {Tensor({2})}));
  EXPECT_FALSE(SameSignature("", {Tensor({2})}, "k", {Tensor({2})}));
  // A key byte must not be confused with tensor bytes that follow it.
  EXPECT_FALSE(SameSignature(std::string("\0", 1), {}, "", {}));
}

TEST(Signature, DifferentDtypeDiffers) {
  gf_tensor other = Tensor({2, 3});
  other.dtype = GF_FAKE_DTYPE_FLOAT32 + 1;
  EXPECT_FALSE(SameSignature("k", {Tensor({2, 3})}, "k", {other}));
}

TEST(Signature, DifferentDeviceIndexDiffers) {
  gf_tensor other = Tensor({2, 3});
  other.device_index = 1;
  EXPECT_FALSE(SameSignature("k", {Tensor({2, 3})}, "k", {other}));
}

TEST(Signature, DifferentDeviceTypeDiffers) {
  gf_tensor other = Tensor({2, 3});
  other.device_type = GF_FAKE_DEVICE_TYPE + 1;
  EXPECT_FALSE(SameSignature("k", {Tensor({2, 3})}, "k", {other}));
}

TEST(Signature, DifferentShapeDiffers) {
  EXPECT_FALSE(SameSignature("k", {Tensor({2, 3})}, "k", {Tensor({3, 2})}));
  EXPECT_FALSE(SameSignature("k", {Tensor({2, 3})}, "k", {Tensor({2, 4})}));
}

TEST(Signature, DifferentNdimDiffers) {
  EXPECT_FALSE(SameSignature("k", {Tensor({6})}, "k", {Tensor({6, 1})}));
  EXPECT_FALSE(SameSignature("k", {Tensor({})}, "k", {Tensor({1})}));
}

TEST(Signature, DifferentTensorCountDiffers) {
  EXPECT_FALSE(SameSignature("k", {Tensor({2})}, "k", {Tensor({2}), Tensor({2})}));
  EXPECT_FALSE(SameSignature("k", {}, "k", {Tensor({})}));
}

// The tensors' part alone (the churn guard's value rule): keys that differ in their own bytes only
// share it; a shape or a tensor more does not.
TEST(Signature, TensorsHashIgnoresTheKeyAndFollowsTheTensors) {
  Signature a;
  Signature b;
  Signature c;
  Signature d;
  ASSERT_EQ(a.Build("scale=0.5", {Tensor({2, 3}), Tensor({4})}), GF_OK);
  ASSERT_EQ(b.Build("scale=0.75!", {Tensor({2, 3}), Tensor({4})}), GF_OK);
  ASSERT_EQ(c.Build("scale=0.5", {Tensor({2, 4}), Tensor({4})}), GF_OK);
  ASSERT_EQ(d.Build("scale=0.5", {Tensor({2, 3}), Tensor({4}), Tensor({1})}), GF_OK);
  EXPECT_NE(a.sig.hash, b.sig.hash);
  EXPECT_EQ(gf_signature_tensors_hash(&a.sig), gf_signature_tensors_hash(&b.sig));
  EXPECT_NE(gf_signature_tensors_hash(&a.sig), gf_signature_tensors_hash(&c.sig));
  EXPECT_NE(gf_signature_tensors_hash(&a.sig), gf_signature_tensors_hash(&d.sig));
  gf_signature empty = {};
  EXPECT_EQ(gf_signature_tensors_hash(&empty), 0u);
}

TEST(Signature, TensorOrderMatters) {
  EXPECT_FALSE(SameSignature("k", {Tensor({2}), Tensor({3})}, "k", {Tensor({3}), Tensor({2})}));
}

TEST(Signature, StridesDoNotMatter) {
  gf_tensor transposed = Tensor({2, 3});
  transposed.strides[0] = 1;
  transposed.strides[1] = 2;
  EXPECT_TRUE(SameSignature("k", {Tensor({2, 3})}, "k", {transposed}));
}

TEST(Signature, HandleDoesNotMatter) {
  gf_tensor owned = Tensor({2});
  int token = 0;
  owned.handle = &token;
  EXPECT_TRUE(SameSignature("k", {Tensor({2})}, "k", {owned}));
}

TEST(Signature, RebuildReusesTheSignature) {
  Signature sig;
  ASSERT_EQ(sig.Build("a-long-key-for-the-first-build", {Tensor({2, 3, 4, 5})}), GF_OK);
  ASSERT_EQ(sig.Build("k", {Tensor({7})}), GF_OK);
  Signature fresh;
  ASSERT_EQ(fresh.Build("k", {Tensor({7})}), GF_OK);
  EXPECT_TRUE(gf_signature_equal(&sig.sig, &fresh.sig));
  EXPECT_EQ(sig.Bytes(), fresh.Bytes());
}

TEST(Signature, CopyIsEqualAndIndependent) {
  Signature original;
  ASSERT_EQ(original.Build("k", {Tensor({2, 3})}), GF_OK);
  Signature copy;
  ASSERT_EQ(gf_signature_copy(&copy.sig, &original.sig, nullptr), GF_OK);
  EXPECT_TRUE(gf_signature_equal(&copy.sig, &original.sig));
  EXPECT_NE(copy.sig.bytes, original.sig.bytes);
  ASSERT_EQ(original.Build("other", {Tensor({2, 3})}), GF_OK);
  EXPECT_FALSE(gf_signature_equal(&copy.sig, &original.sig));
}

TEST(Signature, CustomHashIsUsedButBytesStillDecide) {
  Signature a;
  Signature b;
  ASSERT_EQ(a.Build("a", {Tensor({2})}, ConstantHash), GF_OK);
  ASSERT_EQ(b.Build("b", {Tensor({2})}, ConstantHash), GF_OK);
  EXPECT_EQ(a.sig.hash, 42u);
  EXPECT_EQ(b.sig.hash, 42u);
  EXPECT_FALSE(gf_signature_equal(&a.sig, &b.sig));
}

TEST(Signature, TooManyDimensionsIsAnInvalidArgument) {
  std::vector<int64_t> sizes(GF_MAX_DIMS, 1);
  gf_tensor deep = Tensor(sizes);
  deep.ndim = GF_MAX_DIMS + 1;
  Signature sig;
  gf_error err = {};
  EXPECT_EQ(sig.Build("k", {Tensor({2}), deep}, nullptr, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(err.code, GF_ERR_INVALID_ARGUMENT);
  std::string message = err.message;
  EXPECT_NE(message.find("input tensor 1"), std::string::npos) << message;
  std::string got_dims = std::to_string(GF_MAX_DIMS + 1);
  got_dims += " dimensions";
  std::string limit = "at most ";
  limit += std::to_string(GF_MAX_DIMS);
  EXPECT_NE(message.find(got_dims), std::string::npos) << message;
  EXPECT_NE(message.find(limit), std::string::npos) << message;
}

TEST(Signature, MaxDimsIsAccepted) {
  std::vector<int64_t> sizes(GF_MAX_DIMS, 1);
  Signature sig;
  EXPECT_EQ(sig.Build("k", {Tensor(sizes)}), GF_OK);
}

// Release callback of the collision test: only counts.
void CountRelease(void *context, gf_entry *) { ++*static_cast<int *>(context); }

TEST(Signature, ForcedHashCollisionKeepsEntriesApart) {
  gf_cache cache;
  int released = 0;
  ASSERT_EQ(gf_cache_init(&cache, 8, CountRelease, &released, nullptr), GF_OK);
  const std::vector<std::vector<gf_tensor>> calls = {
      {Tensor({2})}, {Tensor({3})}, {Tensor({2}), Tensor({2})}, {Tensor({2, 1})}};
  std::vector<gf_entry *> entries;
  for (const auto &tensors : calls) {
    Signature sig;
    ASSERT_EQ(sig.Build("k", tensors, ConstantHash), GF_OK);
    ASSERT_EQ(gf_cache_lookup(&cache, &sig.sig), nullptr) << "collided into another entry";
    gf_entry *entry = gf_entry_create(&sig.sig, 0, nullptr);
    ASSERT_NE(entry, nullptr);
    ASSERT_EQ(gf_cache_insert(&cache, entry, nullptr), GF_OK);
    entries.push_back(entry);
  }
  EXPECT_EQ(cache.count, calls.size());
  // Every lookup, in an order unlike insertion, finds its own entry in the shared bucket.
  for (size_t i : {2u, 0u, 3u, 1u, 0u}) {
    Signature sig;
    ASSERT_EQ(sig.Build("k", calls[i], ConstantHash), GF_OK);
    EXPECT_EQ(gf_cache_lookup(&cache, &sig.sig), entries[i]) << "call " << i;
  }
  Signature absent;
  ASSERT_EQ(absent.Build("k", {Tensor({5})}, ConstantHash), GF_OK);
  EXPECT_EQ(gf_cache_lookup(&cache, &absent.sig), nullptr);
  // Removing one colliding entry leaves the others reachable.
  gf_cache_remove(&cache, entries[0]);
  EXPECT_EQ(released, 1);
  for (size_t i = 1; i < calls.size(); ++i) {
    Signature sig;
    ASSERT_EQ(sig.Build("k", calls[i], ConstantHash), GF_OK);
    EXPECT_EQ(gf_cache_lookup(&cache, &sig.sig), entries[i]) << "call " << i;
  }
  gf_cache_destroy(&cache);
  EXPECT_EQ(released, static_cast<int>(calls.size()));
}

// Contiguity as torch decides it: the core refuses a non-contiguous input, so it must agree with
// the shim, which makes only torch-non-contiguous tensors dense before the call.
TEST(TensorFacts, ZeroSizeTensorsAreContiguousWhateverTheirStrides) {
  std::vector<int64_t> sizes = {2, 0, 8};
  gf_tensor empty = gf_fake_view(nullptr, 3, sizes.data());
  empty.strides[0] = 1; // torch.empty(2, 0, 8) has strides (0, 8, 1) or others: any
  empty.strides[1] = 77;
  EXPECT_EQ(gf_tensor_is_contiguous(&empty), 1);
  EXPECT_EQ(gf_tensor_nbytes(&empty), 0);
}

TEST(TensorFacts, HugeSizesAreNotContiguousAndDoNotOverflow) {
  std::vector<int64_t> sizes = {INT64_MAX / 2, 4, 1};
  gf_tensor huge = gf_fake_view(nullptr, 3, sizes.data());
  huge.strides[0] = 1; // a stride product that would overflow int64 cannot be real memory
  EXPECT_EQ(gf_tensor_is_contiguous(&huge), 0);
}

TEST(TensorFacts, SizeOneDimensionsIgnoreTheirStride) {
  std::vector<int64_t> sizes = {1, 3, 1};
  gf_tensor view = gf_fake_view(nullptr, 3, sizes.data());
  view.strides[0] = 99;
  view.strides[2] = 5;
  EXPECT_EQ(gf_tensor_is_contiguous(&view), 1);
  view.strides[1] = 2;
  EXPECT_EQ(gf_tensor_is_contiguous(&view), 0);
}

} // namespace

// Found by tests/fuzz: sizes no real tensor has overflowed int64 in gf_tensor_nbytes (undefined
// behaviour in C); the products now saturate.
TEST(TensorFacts, ByteSizesSaturateInsteadOfOverflowing) {
  gf_tensor t{};
  t.ndim = 1;
  t.itemsize = 4;
  t.sizes[0] = INT64_MAX;
  EXPECT_EQ(gf_tensor_nbytes(&t), INT64_MAX);
  t.ndim = 2;
  t.sizes[1] = -2;
  EXPECT_EQ(gf_tensor_numel(&t), INT64_MIN);
  t.sizes[0] = 3;
  t.sizes[1] = 5;
  EXPECT_EQ(gf_tensor_nbytes(&t), 60);
}

// Found by tests/fuzz: the pool's byte sum overflowed int64 with such sizes; it now refuses them.
TEST(TensorFacts, APoolRefusesATensorWhoseBytesOverflowTheSum) {
  gf_pool pool{};
  gf_tensor t{};
  t.ndim = 1;
  t.itemsize = 1;
  t.sizes[0] = INT64_MAX - 2;
  ASSERT_EQ(gf_pool_add(&pool, &t, nullptr), GF_OK);
  t.sizes[0] = 5;
  gf_error err{};
  EXPECT_EQ(gf_pool_add(&pool, &t, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pool.count, 1u);
  EXPECT_EQ(pool.bytes, INT64_MAX - 2);
  gf_pool_free(&pool, nullptr, nullptr);
}

TEST(Signature, AStateOtherThanTheFirstTellsEqualCallsApart) {
  Signature first;
  Signature same;
  Signature other;
  ASSERT_EQ(first.Build("key", {Tensor({2, 3})}), GF_OK);
  ASSERT_EQ(same.Build("key", {Tensor({2, 3})}), GF_OK);
  ASSERT_EQ(other.Build("key", {Tensor({2, 3})}), GF_OK);
  const std::vector<unsigned char> unmarked = first.Bytes();
  ASSERT_EQ(gf_signature_add_state(&first.sig, 0, nullptr), GF_OK); // the first state: nothing
  EXPECT_EQ(first.Bytes(), unmarked);
  EXPECT_TRUE(gf_signature_equal(&first.sig, &same.sig));
  ASSERT_EQ(gf_signature_add_state(&first.sig, 7, nullptr), GF_OK);
  ASSERT_EQ(gf_signature_add_state(&same.sig, 7, nullptr), GF_OK);
  ASSERT_EQ(gf_signature_add_state(&other.sig, 8, nullptr), GF_OK);
  EXPECT_TRUE(gf_signature_equal(&first.sig, &same.sig));
  EXPECT_EQ(first.sig.hash, same.sig.hash);
  EXPECT_FALSE(gf_signature_equal(&first.sig, &other.sig));
  size_t key_length = 0;
  const unsigned char *key = gf_signature_key(&first.sig, &key_length);
  EXPECT_EQ(std::string(reinterpret_cast<const char *>(key), key_length), "key");
}
