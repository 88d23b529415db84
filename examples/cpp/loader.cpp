// The job of examples/c/loader.c from C++, through the header-only wrapper insitubatch.hpp: open
// a store, split it, run two shuffled epochs over the train split and print an order-independent
// checksum of every value delivered. Every handle frees itself when it goes out of scope and a
// failed call throws insitubatch::Error, so an early exit (an exception in the model's step, say)
// frees everything. Build (see README):
//   c++ -std=c++17 examples/cpp/loader.cpp -Ibindings/c/include -Ltarget/release
//       -linsitubatch -Wl,-rpath,$PWD/target/release -o loader && ./loader STORE
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "insitubatch.hpp"

namespace isb = insitubatch;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s STORE\n", argv[0]);
    return 2;
  }
  try {
    const std::string store = argv[1];
    const std::string manifest = isb::split_by_chunk(store, R"({"fractions": [0.75, 0.25]})");
    // Every dataset argument travels in one JSON config.
    const isb::Dataset ds = isb::Dataset::open("{\"store\": " + isb::json_quote(store) +
                                               ", \"manifest\": " + manifest +
                                               R"(, "batch_size": 8, "seed": 7})");
    uint64_t bits = 0, samples = 0, index_sum = 0;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
      ds.set_epoch(epoch);
      isb::Iter it = ds.iter("train");
      for (isb::Batch &batch : it) {
        for (const uint64_t index : batch.sample_indices()) index_sum += index;
        samples += batch.size();
        for (const std::string &label : batch.labels()) {
          const isb::Tensor t = batch.tensor(label);
          // float32 fields: sum the bit patterns, so the order of batches does not matter.
          const float *values = t.data<float>();
          const size_t n = t.size();
          for (size_t i = 0; i < n; i++) {
            uint32_t b;
            std::memcpy(&b, &values[i], sizeof b);
            bits += b;
          }
        }
      }
    }
    std::printf("samples %" PRIu64 " index_sum %" PRIu64 " checksum %" PRIu64 "\n", samples,
                index_sum, bits);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
