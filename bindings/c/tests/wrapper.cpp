// insitubatch.hpp, the C++ wrapper, against what the C ABI delivers: orders, batches and tensors,
// their lifetimes and early exits, polling with a timeout, errors as exceptions naming the call,
// and chunk transforms written as C++ callables (values, exceptions, release). Compiled and run by
// tests/tests/c_abi.rs with the era5_v3 fixture (t2m: 12 x 9 x 16 float32 in chunks of 4), also
// under AddressSanitizer, which fails the test on any leak; prints "ok" when every check passed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "insitubatch.hpp"

namespace isb = insitubatch;

static int failures = 0;

#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond)) {                                        \
      std::fprintf(stderr, "FAIL line %d: ", __LINE__);   \
      std::fprintf(stderr, __VA_ARGS__);                  \
      std::fprintf(stderr, "\n");                         \
      failures++;                                         \
    }                                                     \
  } while (0)

namespace {

bool contains(const std::string &haystack, const std::string &needle) {
  return haystack.find(needle) != std::string::npos;
}

// The insitubatch::Error `body` throws (a default one, status ISB_OK, if it throws none).
template <typename Body>
isb::Error error_of(Body &&body) {
  try {
    body();
  } catch (const isb::Error &e) {
    return e;
  }
  return isb::Error("(nothing)", ISB_OK, "nothing was thrown");
}

// The message of the exception of type E that `body` throws, or a note saying it did not.
template <typename E, typename Body>
std::string what_of(Body &&body) {
  try {
    body();
  } catch (const E &e) {
    return e.what();
  } catch (const std::exception &e) {
    return std::string("another exception: ") + e.what();
  }
  return "nothing was thrown";
}

// A dataset of t2m alone; `extra` adds config entries (each starting with a comma).
std::string t2m_config(const std::string &store, const std::string &extra = "") {
  return "{\"store\": " + isb::json_quote(store) +
         R"(, "variables": ["t2m"], "batch_size": 5, "executor_threads": 2)" + extra + "}";
}

// Every t2m value of a sequential pass over `all`, in order, as double.
std::vector<double> values(const isb::Dataset &ds) {
  std::vector<double> out;
  isb::Iter it = ds.iter("all");
  for (isb::Batch &b : it) {
    const isb::Tensor t = b.tensor("t2m");
    const size_t n = t.size();
    if (t.dtype_name() == "float64") {
      const double *v = t.data<double>();
      out.insert(out.end(), v, v + n);
    } else {
      const float *v = t.data<float>();
      out.insert(out.end(), v, v + n);
    }
  }
  return out;
}

constexpr size_t kSampleValues = 9 * 16;

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  const std::string store = argv[1];
  try {
    EXPECT(isb::json_quote("a\"b\\c\n") == R"("a\"b\\c\u000a")", "json_quote: %s",
           isb::json_quote("a\"b\\c\n").c_str());

    // 1. Store-level calls.
    const std::string geometries = isb::geometries_json(store);
    EXPECT(contains(geometries, "\"t2m\"") && contains(geometries, "\"u10\"") &&
               !contains(geometries, "\"latitude\""),
           "geometries: %s", geometries.c_str());
    const std::string region = isb::coordinate_region_json(
        store, R"({"array": "t2m", "bounds": {"latitude": [67.5, 0]}})");
    EXPECT(region == R"({"region":[[1,5],[0,16]],"wrap":false})", "coordinate region: %s",
           region.c_str());
    const std::string times = isb::coordinate_values_json(store, R"({"array": "t2m"})");
    EXPECT(contains(times, R"("values":[0,6,12,18,24,30,36,42,48,54,60,66])"),
           "coordinate values: %s", times.c_str());
    isb::Error e = error_of([&] { isb::split_by_chunk(store, R"({"fractions": [1]})", "nope"); });
    EXPECT(e.call() == "isb_split_by_chunk" && e.status() == ISB_INVALID_ARGUMENT &&
               contains(e.what(), "nope"),
           "split of a missing array: %s (status %u)", e.what(), unsigned(e.status()));

    // 2. Errors are exceptions naming the call, its status and the thing.
    e = error_of([&] { isb::Dataset::open(t2m_config(store, R"(, "batch_size": 0)")); });
    EXPECT(e.call() == "isb_dataset_open" && e.status() == ISB_INVALID_ARGUMENT &&
               contains(e.what(), "batch_size"),
           "batch_size 0: %s", e.what());
    const std::vector<double> plain = values(isb::Dataset::open(t2m_config(store)));
    EXPECT(plain.size() == 12 * kSampleValues, "plain pass: %zu values", plain.size());

    // 3. A shuffled epoch: the planned order is what the batches deliver.
    std::vector<isb::Tensor> kept;  // outlive their batches, the iteration and the dataset
    std::vector<std::vector<double>> kept_values;
    {
      const isb::Dataset ds =
          isb::Dataset::open(t2m_config(store, R"(, "seed": 3, "block_chunks": 2)"));
      ds.set_epoch(1);
      e = error_of([&] { ds.iter("nope"); });
      EXPECT(e.call() == "isb_iter_start" && e.status() == ISB_INVALID_ARGUMENT &&
                 contains(e.what(), "nope"),
             "unknown split: %s", e.what());
      e = error_of([&] { ds.iter("train", 4); });
      EXPECT(e.call() == "isb_iter_start_at" && contains(e.what(), "start_batch"),
             "start_batch past the epoch: %s", e.what());

      const auto len = ds.split_len("train");
      const auto order = ds.order("train");
      EXPECT(len.samples == 12 && len.batches == 3, "split_len %llu samples, %llu batches",
             (unsigned long long)len.samples, (unsigned long long)len.batches);
      EXPECT(order.samples.size() == 12 && !order.block_ends.empty() &&
                 order.block_ends.back() == 12,
             "order: %zu samples, %zu blocks", order.samples.size(), order.block_ends.size());
      std::vector<uint64_t> sorted = order.samples;
      std::sort(sorted.begin(), sorted.end());
      std::vector<uint64_t> every(12);
      std::iota(every.begin(), every.end(), 0);
      EXPECT(sorted == every, "the order is not every sample once");
      EXPECT(order.samples != every, "a shuffled epoch came out in index order");

      std::vector<uint64_t> delivered;
      std::vector<size_t> rows;
      {
        isb::Iter it = ds.iter("train");
        for (isb::Batch &b : it) {
          rows.push_back(b.size());
          for (const uint64_t s : b.sample_indices()) delivered.push_back(s);
          EXPECT(b.labels() == std::vector<std::string>{"t2m"}, "labels");
          isb::Tensor t = b.tensor("t2m");
          EXPECT((t.shape() == std::vector<int64_t>{int64_t(b.size()), 9, 16}) &&
                     t.dtype_name() == "float32" && t.nbytes() == b.size() * kSampleValues * 4,
                 "tensor: ndim %d, %s, %zu bytes", t.ndim(), t.dtype_name().c_str(), t.nbytes());
          const std::string wrong = what_of<std::invalid_argument>([&] { t.data<double>(); });
          EXPECT(contains(wrong, "holds float32, not float64"), "data<double>: %s",
                 wrong.c_str());
          // Each row is the plain pass's sample it says it holds.
          const float *v = t.data<float>();
          const auto indices = b.sample_indices();
          for (size_t r = 0; r < indices.size(); r++) {
            for (size_t i = 0; i < kSampleValues; i++) {
              if (double(v[r * kSampleValues + i]) != plain[indices[r] * kSampleValues + i]) {
                EXPECT(false, "sample %llu differs at %zu", (unsigned long long)indices[r], i);
                break;
              }
            }
          }
          kept_values.emplace_back(v, v + t.size());
          kept.push_back(std::move(t));
          EXPECT(!t && what_of<std::logic_error>([&] { t.dl(); }).find("empty") !=
                           std::string::npos,
                 "a moved-from tensor is not empty");
        }
        const std::string stats = it.stats_json();
        EXPECT(contains(stats, "\"split\""), "iter stats: %s", stats.c_str());
      }
      EXPECT(delivered == order.samples, "the batches did not deliver the planned order");
      EXPECT((rows == std::vector<size_t>{5, 5, 2}), "rows per batch");

      // A patch: each row's 3 x 4 window is the plain pass's field at the row's origin.
      {
        const isb::Dataset patched = isb::Dataset::open(t2m_config(store, R"(, "patch": [3, 4])"));
        isb::Iter it = patched.iter("train");
        size_t seen = 0;
        for (isb::Batch &b : it) {
          isb::Tensor t = b.tensor("t2m");
          EXPECT((t.shape() == std::vector<int64_t>{int64_t(b.size()), 3, 4}), "patched shape");
          const auto origins = b.patch_origins();
          const auto indices = b.sample_indices();
          EXPECT(origins.size() == 2 * b.size(), "%zu origins", origins.size());
          const float *v = t.data<float>();
          for (size_t r = 0; r < indices.size() && 2 * r + 1 < origins.size(); r++) {
            for (size_t i = 0; i < 3; i++)
              for (size_t j = 0; j < 4; j++) {
                const size_t at = (origins[2 * r] + i) * 16 + origins[2 * r + 1] + j;
                if (double(v[(r * 3 + i) * 4 + j]) != plain[indices[r] * kSampleValues + at]) {
                  EXPECT(false, "patch of sample %llu differs at (%zu, %zu)",
                         (unsigned long long)indices[r], i, j);
                  i = 3;
                  break;
                }
              }
          }
          seen += b.size();
        }
        EXPECT(seen == 12, "the patched epoch gave %zu rows", seen);
      }

      // Iterators are input iterators (copies share the iteration): std::distance counts the
      // batches left.
      {
        isb::Iter it = ds.iter("train");
        EXPECT(std::distance(it.begin(), it.end()) == 3, "std::distance over an epoch");
        EXPECT(!it.next(), "the epoch is over after std::distance");
      }

      // Early exit: break after the first batch; resuming at batch 1 gives the rest.
      {
        isb::Iter it = ds.iter("train");
        for (isb::Batch &b : it) {
          EXPECT(b.size() == 5, "first batch");
          break;
        }
      }
      std::vector<uint64_t> resumed;
      std::vector<uint64_t> positions;
      isb::Iter rest = ds.iter("train", 1);
      while (auto b = rest.next()) {
        for (const uint64_t s : b->sample_indices()) resumed.push_back(s);
        const isb::Batch::Position p = b->position();
        EXPECT(p.epoch == 1, "a resumed batch's epoch: %llu", (unsigned long long)p.epoch);
        positions.push_back(p.index);
      }
      EXPECT((positions == std::vector<uint64_t>{1, 2}), "resumed batches' places in the epoch");
      EXPECT(!rest.next(), "a finished epoch yields nothing more");
      EXPECT(std::vector<uint64_t>(order.samples.begin() + 5, order.samples.end()) == resumed,
             "resumed at batch 1: %zu samples", resumed.size());

      const std::string memory = ds.memory_json("train");
      EXPECT(contains(memory, "\"total_bytes\""), "memory: %s", memory.c_str());
      const std::string stats = ds.stats_json();
      EXPECT(contains(stats, "\"batch_size\""), "stats: %s", stats.c_str());
      // t2m's 12 samples of 9 x 16; per latitude, 12 x 16 values each (a dataset of its own:
      // this one's iterations above still hold its pool).
      const isb::Dataset fresh = isb::Dataset::open(t2m_config(store));
      const std::string whole = fresh.statistics_json("all");
      EXPECT(contains(whole, R"("t2m":{"axis":null,"count":[1728])"), "statistics: %s", whole.c_str());
      const std::string per_lat = fresh.statistics_json("all", R"({"axis": 0})");
      EXPECT(contains(per_lat, R"("count":[192,192,192,192,192,192,192,192,192])"),
             "statistics per latitude: %s", per_lat.c_str());
      e = error_of([&] { fresh.statistics_json("all", R"({"axis": 2})"); });
      EXPECT(e.call() == "isb_statistics_new" && e.status() == ISB_INVALID_ARGUMENT,
             "statistics past the axes: %s", e.what());

      isb::Dataset moved = isb::Dataset::open(t2m_config(store));
      isb::Dataset taken = std::move(moved);
      e = error_of([&] { moved.set_epoch(0); });
      EXPECT(!moved && taken && e.status() == ISB_NULL_POINTER,
             "a moved-from dataset: %s (status %u)", e.what(), unsigned(e.status()));
    }
    // The dataset and its iterations are gone; the tensors kept from its batches are intact.
    for (size_t k = 0; k < kept.size(); k++) {
      const float *v = kept[k].data<float>();
      EXPECT(std::equal(kept_values[k].begin(), kept_values[k].end(), v),
             "tensor %zu changed after its dataset was freed", k);
    }
    EXPECT(kept.size() == 3, "kept %zu tensors", kept.size());
    kept.clear();

    // A tensor released to a consumer that calls its deleter itself.
    {
      isb::Dataset ds = isb::Dataset::open(t2m_config(store));
      isb::Iter it = ds.iter("all");
      std::optional<isb::Batch> b = it.next();
      isb::Tensor t = b->tensor("t2m");
      DLManagedTensorVersioned *raw = t.release();
      EXPECT(!t && raw != nullptr, "release");
      b.reset();
      it = isb::Iter();
      ds = isb::Dataset();
      const float *v = static_cast<const float *>(raw->dl_tensor.data);
      EXPECT(double(v[0]) == plain[0] &&
                 double(v[5 * kSampleValues - 1]) == plain[5 * kSampleValues - 1],
             "a released tensor after its dataset was freed");
      raw->deleter(raw);
    }

    // 4. Polling with a timeout delivers every sample once, in order; a chunk that takes 100 ms
    //    (a slow transform) makes the 1 ms polls time out first.
    {
      const isb::Dataset ds = isb::Dataset::open(
          t2m_config(store, R"(, "shuffle": false, "chunk_transforms": [{"type": "callback",)"
                            R"( "callback": 0}])"),
          {[](const isb::Chunk &, const isb::Chunk &) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }});
      isb::Iter it = ds.iter("all");
      std::vector<uint64_t> polled;
      int polls = 0, timeouts = 0;
      bool ended = false;
      while (!ended && polls++ < 20000) {
        isb::Waited w = it.next_for(std::chrono::microseconds(1));  // rounded up to 1 ms
        if (w.batch)
          for (const uint64_t s : w.batch->sample_indices()) polled.push_back(s);
        timeouts += w.timed_out;
        ended = w.end_of_epoch();
      }
      std::vector<uint64_t> every(12);
      std::iota(every.begin(), every.end(), 0);
      EXPECT(ended && polled == every && timeouts > 0,
             "polled %zu samples in %d polls, %d timed out", polled.size(), polls, timeouts);
    }

    // 5. Chunk transforms as C++ callables.
    {
      auto calls = std::make_shared<std::atomic<int>>(0);
      auto bad_input = std::make_shared<std::atomic<int>>(0);
      const std::string in_place =
          R"(, "shuffle": false, "chunk_transforms": [{"type": "callback", "callback": 0}])";
      {
        const isb::Dataset ds = isb::Dataset::open(
            t2m_config(store, in_place), {[calls, bad_input](const isb::Chunk &in,
                                                             const isb::Chunk &out) {
              calls->fetch_add(1);
              const auto shape = in.shape();
              if (in.array() != "t2m" || shape.size() != 3 || shape[0] != 4 || shape[1] != 9 ||
                  shape[2] != 16 || in.dtype() != "float32" || in.size() != 4 * kSampleValues ||
                  out.bytes() != in.bytes())
                bad_input->fetch_add(1);
              float *v = out.data<float>();
              for (size_t i = 0; i < out.size(); i++) v[i] = v[i] * 0.5f + -273.15f;
            }});
        EXPECT(calls.use_count() == 2, "the library holds the callable: %ld", calls.use_count());
        const std::vector<double> got = values(ds);
        EXPECT(got.size() == plain.size(), "transformed pass: %zu values", got.size());
        for (size_t i = 0; i < got.size() && i < plain.size(); i++) {
          if (got[i] != double(float(plain[i]) * 0.5f + -273.15f)) {
            EXPECT(false, "value %zu: %.9g from %.9g", i, got[i], plain[i]);
            break;
          }
        }
        EXPECT(calls->load() == 3 && bad_input->load() == 0, "calls %d, bad input %d",
               calls->load(), bad_input->load());
      }
      EXPECT(calls.use_count() == 1, "the callable was not released with its dataset");

      // A shape and dtype of its own, declared in the config: row means over longitude.
      {
        const isb::Dataset ds = isb::Dataset::open(
            t2m_config(store, R"(, "shuffle": false, "chunk_transforms": [{"type": "callback",)"
                              R"( "callback": 0, "shape": [9], "dtype": "float64"}])"),
            {[](const isb::Chunk &in, const isb::Chunk &out) {
              const float *x = in.data<float>();
              double *y = out.data<double>();
              for (size_t r = 0; r < out.size(); r++) {
                double sum = 0;
                for (size_t c = 0; c < 16; c++) sum += x[r * 16 + c];
                y[r] = sum / 16;
              }
            }});
        const std::vector<double> means = values(ds);
        EXPECT(means.size() == 12 * 9, "row means: %zu values", means.size());
        for (size_t r = 0; r < means.size(); r++) {
          double sum = 0;
          for (size_t c = 0; c < 16; c++) sum += float(plain[r * 16 + c]);
          if (means[r] != sum / 16) {
            EXPECT(false, "row mean %zu: %.9g against %.9g", r, means[r], sum / 16);
            break;
          }
        }
      }

      // An exception fails the pass with ISB_TRANSFORM and its message; so does a wrong type.
      const std::string one_callback =
          R"(, "chunk_transforms": [{"type": "callback", "callback": 0}])";
      e = error_of([&] {
        values(isb::Dataset::open(t2m_config(store, one_callback),
                                  {[](const isb::Chunk &in, const isb::Chunk &) {
                                    throw std::runtime_error("no t2m today in chunk " +
                                                             std::to_string(in.index()));
                                  }}));
      });
      EXPECT(e.call() == "isb_iter_next" && e.status() == ISB_TRANSFORM &&
                 contains(e.what(), "no t2m today in chunk "),
             "a throwing transform: %s (status %u)", e.what(), unsigned(e.status()));
      e = error_of([&] {
        values(isb::Dataset::open(t2m_config(store, one_callback),
                                  {[](const isb::Chunk &in, const isb::Chunk &) {
                                    in.data<double>();
                                  }}));
      });
      EXPECT(e.status() == ISB_TRANSFORM && contains(e.what(), " of t2m is float32, not float64"),
             "a transform reading the wrong type: %s", e.what());

      // Refused configs and callables: a failed open releases what it was given.
      auto held = std::make_shared<int>(0);
      e = error_of([&] {
        isb::Dataset::open(
            t2m_config(store, R"(, "chunk_transforms": [{"type": "callback", "callback": 1}])"),
            {[held](const isb::Chunk &, const isb::Chunk &) {}});
      });
      EXPECT(e.call() == "isb_dataset_open_with_transforms" &&
                 e.status() == ISB_INVALID_ARGUMENT && held.use_count() == 1,
             "callback 1 of 1: %s (held %ld)", e.what(), held.use_count());
      const std::string empty = what_of<std::invalid_argument>(
          [&] { isb::Dataset::open(t2m_config(store, one_callback), {isb::Transform()}); });
      EXPECT(contains(empty, "transform 0 is empty"), "an empty callable: %s", empty.c_str());
    }

    EXPECT(isb::shutdown_callbacks(std::chrono::seconds(1)), "callbacks still running");
  } catch (const std::exception &ex) {
    std::fprintf(stderr, "FAIL: uncaught %s\n", ex.what());
    return 1;
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
