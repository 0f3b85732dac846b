// Tests for gf_cache: LRU order and eviction under max_entries, pinned entries that are never
// evicted (and the one-time report when the cache must grow past its limit), and release of every
// entry through the callback.
#include "gf_cache.h"
#include "gf_signature.h"

#include <gtest/gtest.h>

#include <cstdint>

#include <cstring>
#include <string>
#include <vector>

namespace {

// The key a signature built by Cache::Sig was made from (it follows the u64 key length).
std::string KeyOf(const gf_entry *entry) {
  const gf_signature &sig = entry->signature;
  uint64_t length = 0;
  memcpy(&length, sig.bytes, sizeof length);
  return std::string(reinterpret_cast<const char *>(sig.bytes) + sizeof length, length);
}

// prefix followed by i ("k7"); built by appending, which GCC 12 at -O3 does not misdiagnose.
std::string Numbered(const char *prefix, int i) {
  std::string key = prefix;
  key += std::to_string(i);
  return key;
}

// A cache of entries named by their keys, recording the keys of released entries in order.
class Cache : public ::testing::Test {
protected:
  void TearDown() override {
    if (initialised_) {
      gf_cache_destroy(&cache_);
    }
    gf_signature_free(&scratch_);
  }

  void Init(size_t max_entries) {
    ASSERT_EQ(gf_cache_init(&cache_, max_entries, Record, this, nullptr), GF_OK);
    initialised_ = true;
  }

  const gf_signature *Sig(const std::string &key) {
    EXPECT_EQ(gf_signature_build(&scratch_, key.data(), key.size(), nullptr, 0, nullptr, nullptr),
              GF_OK);
    return &scratch_;
  }

  // make_room then insert, as the runner does; returns grew_past_limit.
  int Add(const std::string &key, int pinned = 0) {
    int grew = -1;
    gf_cache_make_room(&cache_, &grew);
    gf_entry *entry = gf_entry_create(Sig(key), pinned, nullptr);
    EXPECT_NE(entry, nullptr);
    EXPECT_EQ(gf_cache_insert(&cache_, entry, nullptr), GF_OK);
    return grew;
  }

  bool Has(const std::string &key) {
    // Lookup refreshes LRU order, so check through the bucket chains instead.
    const gf_signature *sig = Sig(key);
    for (size_t b = 0; b < cache_.bucket_count; ++b) {
      for (gf_entry *e = cache_.buckets[b]; e != nullptr; e = e->bucket_next) {
        if (gf_signature_equal(&e->signature, sig)) {
          return true;
        }
      }
    }
    return false;
  }

  gf_entry *Lookup(const std::string &key) { return gf_cache_lookup(&cache_, Sig(key)); }

  // Keys from newest to oldest use.
  std::vector<std::string> LruOrder() const {
    std::vector<std::string> keys;
    for (const gf_entry *e = cache_.newest; e != nullptr; e = e->lru_older) {
      keys.push_back(KeyOf(e));
    }
    return keys;
  }

  static void Record(void *context, gf_entry *entry) {
    static_cast<Cache *>(context)->released_.push_back(KeyOf(entry));
  }

  gf_cache cache_ = {};
  gf_signature scratch_ = {};
  bool initialised_ = false;
  std::vector<std::string> released_;
};

using Keys = std::vector<std::string>;

TEST_F(Cache, ZeroMaxEntriesIsAnError) {
  gf_error err = {};
  EXPECT_EQ(gf_cache_init(&cache_, 0, Record, this, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(err.code, GF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("max_entries"), std::string::npos) << err.message;
}

TEST_F(Cache, LookupFindsInsertedAndMissesAbsent) {
  Init(4);
  Add("a");
  Add("b");
  EXPECT_NE(Lookup("a"), nullptr);
  EXPECT_EQ(KeyOf(Lookup("b")), "b");
  EXPECT_EQ(Lookup("c"), nullptr);
  EXPECT_EQ(cache_.count, 2u);
}

TEST_F(Cache, InsertMakesNewestAndLookupRefreshes) {
  Init(8);
  Add("a");
  Add("b");
  Add("c");
  EXPECT_EQ(LruOrder(), (Keys{"c", "b", "a"}));
  Lookup("a");
  EXPECT_EQ(LruOrder(), (Keys{"a", "c", "b"}));
  Lookup("c");
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "b"}));
  Lookup("c"); // already newest
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "b"}));
  EXPECT_EQ(KeyOf(cache_.oldest), "b");
  Lookup("missing");
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "b"}));
}

TEST_F(Cache, EvictsLeastRecentlyUsedAtMaxEntries) {
  Init(3);
  Add("a");
  Add("b");
  Add("c");
  EXPECT_TRUE(released_.empty());
  Lookup("a"); // b is now the oldest
  EXPECT_EQ(Add("d"), 0);
  EXPECT_EQ(released_, (Keys{"b"}));
  EXPECT_EQ(cache_.count, 3u);
  EXPECT_EQ(cache_.evictions, 1u);
  EXPECT_FALSE(Has("b"));
  EXPECT_TRUE(Has("a") && Has("c") && Has("d"));
  Add("e"); // c is the oldest now
  EXPECT_EQ(released_, (Keys{"b", "c"}));
  EXPECT_EQ(cache_.evictions, 2u);
  EXPECT_EQ(LruOrder(), (Keys{"e", "d", "a"}));
}

TEST_F(Cache, MaxEntriesIsNeverExceededWithoutPins) {
  Init(2);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(Add(Numbered("k", i)), 0);
    EXPECT_LE(cache_.count, 2u);
  }
  EXPECT_EQ(cache_.count, 2u);
  EXPECT_EQ(cache_.evictions, 48u);
  EXPECT_EQ(released_.size(), 48u);
  EXPECT_EQ(LruOrder(), (Keys{"k49", "k48"}));
}

TEST_F(Cache, MaxEntriesOfOneKeepsOnlyTheNewest) {
  Init(1);
  Add("a");
  Add("b");
  EXPECT_EQ(released_, (Keys{"a"}));
  EXPECT_EQ(LruOrder(), (Keys{"b"}));
}

TEST_F(Cache, PinnedEntriesAreNeverEvicted) {
  Init(2);
  Add("pinned", 1);
  Add("a");
  Add("b"); // the oldest, "pinned", is skipped; "a" goes
  EXPECT_EQ(released_, (Keys{"a"}));
  Lookup("b");
  Add("c"); // "pinned" is now the oldest again, still skipped
  EXPECT_EQ(released_, (Keys{"a", "b"}));
  EXPECT_TRUE(Has("pinned"));
  EXPECT_EQ(cache_.pinned_count, 1u);
  EXPECT_EQ(cache_.count, 2u);
  EXPECT_EQ(cache_.evictions, 2u);
}

TEST_F(Cache, AllPinnedGrowsPastLimitAndReportsOnce) {
  Init(2);
  EXPECT_EQ(Add("p1", 1), 0);
  EXPECT_EQ(Add("p2", 1), 0);
  EXPECT_EQ(Add("p3", 1), 1); // the first growth past the limit is reported
  EXPECT_EQ(cache_.count, 3u);
  EXPECT_EQ(Add("p4", 1), 0); // ... and only once
  EXPECT_EQ(Add("u", 0), 0);
  EXPECT_EQ(cache_.count, 5u);
  EXPECT_EQ(cache_.pinned_count, 4u);
  EXPECT_EQ(cache_.evictions, 0u);
  EXPECT_TRUE(released_.empty());
  // The unpinned entry is the only candidate once the cache is over its limit; it goes first.
  EXPECT_EQ(Add("v", 0), 0);
  EXPECT_EQ(released_, (Keys{"u"}));
  EXPECT_EQ(cache_.count, 5u);
  EXPECT_EQ(cache_.evictions, 1u);
}

TEST_F(Cache, HugeMaxEntriesNeitherHangsNorAllocatesUpFront) {
  Init(SIZE_MAX); // sys.maxsize from Python: the bucket count must not be doubled without end
  EXPECT_EQ(cache_.bucket_count, static_cast<size_t>(GF_CACHE_INITIAL_BUCKETS_MAX));
  for (int i = 0; i < 3; ++i) {
    Add(Numbered("entry", i), 0);
  }
  EXPECT_EQ(cache_.count, 3u);
  EXPECT_NE(Lookup(Numbered("entry", 1)), nullptr);
}

TEST_F(Cache, SmallMaxEntriesStartsWithTwiceAsManyBuckets) {
  Init(100);
  EXPECT_EQ(cache_.bucket_count, 256u);
}

TEST_F(Cache, GrowsThroughManyBucketsAndStillFindsEverything) {
  Init(1); // 16 buckets at first
  for (int i = 0; i < 100; ++i) {
    Add(Numbered("pinned", i), 1);
  }
  EXPECT_EQ(cache_.count, 100u);
  EXPECT_GE(cache_.bucket_count, 100u);
  for (int i = 0; i < 100; ++i) {
    gf_entry *entry = Lookup(Numbered("pinned", i));
    ASSERT_NE(entry, nullptr) << i;
    EXPECT_EQ(KeyOf(entry), Numbered("pinned", i));
  }
}

TEST_F(Cache, RemoveUnlinksAndReleasesOne) {
  Init(4);
  Add("a");
  Add("b", 1);
  Add("c");
  gf_cache_remove(&cache_, Lookup("b"));
  EXPECT_EQ(released_, (Keys{"b"}));
  EXPECT_EQ(cache_.count, 2u);
  EXPECT_EQ(cache_.pinned_count, 0u);
  EXPECT_EQ(Lookup("b"), nullptr);
  EXPECT_EQ(cache_.evictions, 0u); // removal is not eviction
  EXPECT_EQ(LruOrder(), (Keys{"c", "a"}));
}

TEST_F(Cache, ClearReleasesEveryEntryAndStaysUsable) {
  Init(4);
  Add("a");
  Add("b", 1);
  Add("c");
  gf_cache_clear(&cache_);
  EXPECT_EQ(released_.size(), 3u);
  EXPECT_TRUE(Has("a") == false && Has("b") == false && Has("c") == false);
  EXPECT_EQ(cache_.count, 0u);
  EXPECT_EQ(cache_.pinned_count, 0u);
  EXPECT_EQ(cache_.newest, nullptr);
  EXPECT_EQ(cache_.oldest, nullptr);
  Add("d");
  EXPECT_NE(Lookup("d"), nullptr);
  EXPECT_EQ(cache_.count, 1u);
}

TEST_F(Cache, DestroyReleasesEveryEntry) {
  Init(4);
  Add("a");
  Add("b");
  gf_cache_destroy(&cache_);
  initialised_ = false;
  EXPECT_EQ(released_.size(), 2u);
  EXPECT_EQ(cache_.buckets, nullptr);
}

TEST_F(Cache, EntryCreateCopiesSignatureAndPin) {
  Init(1);
  gf_entry *entry = gf_entry_create(Sig("a"), 7, nullptr);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->pinned, 1);
  EXPECT_NE(entry->signature.bytes, scratch_.bytes);
  EXPECT_TRUE(gf_signature_equal(&entry->signature, Sig("a")));
  Sig("something else");
  EXPECT_EQ(KeyOf(entry), "a");
  EXPECT_EQ(entry->graph, nullptr);
  EXPECT_EQ(entry->replays, 0u);
  gf_entry_destroy(entry);
}

} // namespace
