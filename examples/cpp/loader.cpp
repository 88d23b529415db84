// The job of examples/c/loader.c from C++: open a store, split it, run two shuffled epochs over
// the train split and print an order-independent checksum of every value delivered. Each C handle
// is owned by a std::unique_ptr whose deleter frees it, and a failed call throws, so an early
// exit (an exception in the model's step, say) frees everything. Build (see README):
//   c++ -std=c++17 examples/cpp/loader.cpp -Ibindings/c/include -Ltarget/release
//       -linsitubatch -Wl,-rpath,$PWD/target/release -o loader && ./loader STORE
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "insitubatch.h"

namespace {

// A failed call: what was called and the library's message.
class Failure : public std::runtime_error {
 public:
  Failure(const char *call, IsbError *err)
      : std::runtime_error(std::string(call) + " failed: " + isb_error_message(err)),
        status(isb_error_status(err)) {
    isb_error_free(err);
  }
  IsbStatus status;
};

// Runs `call(&err)` and throws unless it returns one of the two statuses a caller expects.
template <typename Call>
IsbStatus check(const char *name, Call call, IsbStatus also_fine = ISB_OK) {
  IsbError *err = nullptr;
  IsbStatus st = call(&err);
  if (st != ISB_OK && st != also_fine) throw Failure(name, err);
  return st;
}

struct Free {
  void operator()(IsbDataset *p) const { isb_dataset_free(p); }
  void operator()(IsbIter *p) const { isb_iter_free(p); }
  void operator()(IsbBatch *p) const { isb_batch_free(p); }
  void operator()(DLManagedTensorVersioned *t) const { t->deleter(t); }
  void operator()(char *s) const { isb_string_free(s); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

// `s` as a JSON string literal.
std::string json_string(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s STORE\n", argv[0]);
    return 2;
  }
  if (isb_abi_version() != ISB_ABI_VERSION) {
    std::fprintf(stderr, "libinsitubatch ABI %u, header %u: rebuild\n", isb_abi_version(),
                 ISB_ABI_VERSION);
    return 2;
  }
  try {
    const std::string store = argv[1];
    char *raw = nullptr;
    check("isb_split_by_chunk", [&](IsbError **e) {
      return isb_split_by_chunk(store.c_str(), nullptr, R"({"fractions": [0.75, 0.25]})", &raw, e);
    });
    Owned<char> manifest(raw);
    // Every dataset argument travels in one JSON config.
    const std::string config = "{\"store\": " + json_string(store) + ", \"manifest\": " +
                               manifest.get() + R"(, "batch_size": 8, "seed": 7})";
    IsbDataset *opened = nullptr;
    check("isb_dataset_open",
          [&](IsbError **e) { return isb_dataset_open(config.c_str(), &opened, e); });
    Owned<IsbDataset> ds(opened);

    uint64_t bits = 0, samples = 0, index_sum = 0;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
      check("isb_dataset_set_epoch",
            [&](IsbError **e) { return isb_dataset_set_epoch(ds.get(), epoch, e); });
      IsbIter *started = nullptr;
      check("isb_iter_start",
            [&](IsbError **e) { return isb_iter_start(ds.get(), "train", &started, e); });
      Owned<IsbIter> it(started);
      for (;;) {
        IsbBatch *next = nullptr;
        auto st = check(
            "isb_iter_next", [&](IsbError **e) { return isb_iter_next(it.get(), &next, e); },
            ISB_END_OF_EPOCH);
        if (st == ISB_END_OF_EPOCH) break;
        Owned<IsbBatch> b(next);
        size_t labels = 0, len = 0;
        const uint64_t *idx = nullptr;
        check("isb_batch_label_count",
              [&](IsbError **e) { return isb_batch_label_count(b.get(), &labels, e); });
        check("isb_batch_sample_indices",
              [&](IsbError **e) { return isb_batch_sample_indices(b.get(), &idx, &len, e); });
        samples += len;
        for (size_t i = 0; i < len; i++) index_sum += idx[i];
        for (size_t l = 0; l < labels; l++) {
          const char *label = nullptr;
          DLManagedTensorVersioned *exported = nullptr;
          check("isb_batch_label",
                [&](IsbError **e) { return isb_batch_label(b.get(), l, &label, e); });
          check("isb_batch_export",
                [&](IsbError **e) { return isb_batch_export(b.get(), label, &exported, e); });
          Owned<DLManagedTensorVersioned> t(exported);
          size_t count = 1;
          for (int d = 0; d < t->dl_tensor.ndim; d++) count *= size_t(t->dl_tensor.shape[d]);
          // float32 fields: sum the bit patterns, so the order of batches does not matter.
          auto v = static_cast<const uint32_t *>(t->dl_tensor.data);
          for (size_t i = 0; i < count; i++) bits += v[i];
        }
      }
    }
    std::printf("samples %" PRIu64 " index_sum %" PRIu64 " checksum %" PRIu64 "\n", samples,
                index_sum, bits);
    return 0;
  } catch (const Failure &f) {
    std::fprintf(stderr, "%s\n", f.what());
    return 1;
  }
}
