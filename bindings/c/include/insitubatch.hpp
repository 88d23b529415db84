// insitubatch.hpp: the C ABI of insitubatch.h for C++17, header only.
//
// Every handle is a move-only object that frees what it owns when it goes out of scope, so an
// exception anywhere (a failed call, or the model's own step) releases everything. A failed call
// throws insitubatch::Error, which carries the function's name, its IsbStatus and the library's
// message. Nothing throws across the C ABI: a chunk transform written as a C++ callable has its
// exceptions caught at the boundary and turned into the pass's ISB_TRANSFORM error.
//
//   namespace isb = insitubatch;
//   auto ds = isb::Dataset::open(R"({"store": "era5.zarr", "batch_size": 32})");
//   for (uint64_t epoch = 0; epoch < 10; epoch++) {
//     ds.set_epoch(epoch);
//     auto it = ds.iter("train");
//     for (isb::Batch &batch : it) {
//       isb::Tensor t2m = batch.tensor("t2m");      // (batch, lat, lon), no copy
//       const float *values = t2m.data<float>();    // throws unless the tensor is float32
//       ...
//     }
//   }
//
// Threads, fork and ownership are as insitubatch.h says: a Dataset may be used from several
// threads at once, an Iter by one thread at a time; a Tensor stays valid after its Batch, Iter
// and Dataset are gone. See docs/c-api.md, "C++".
#ifndef INSITUBATCH_HPP
#define INSITUBATCH_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "insitubatch.h"

namespace insitubatch {

// A failed call: which function, its status and the library's message.
class Error : public std::runtime_error {
 public:
  Error(std::string call, IsbStatus status, const std::string &message)
      : std::runtime_error(call + " failed: " + message), call_(std::move(call)), status_(status) {}

  // The C function that failed, such as "isb_iter_next".
  const std::string &call() const noexcept { return call_; }
  IsbStatus status() const noexcept { return status_; }

 private:
  std::string call_;
  IsbStatus status_;
};

// A read-only view of `size()` values that some handle owns (C++17 has no std::span).
template <typename T>
class Span {
 public:
  Span() = default;
  Span(const T *data, std::size_t size) noexcept : data_(data), size_(size) {}
  const T *data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const T *begin() const noexcept { return data_; }
  const T *end() const noexcept { return data_ + size_; }
  const T &operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const T *data_ = nullptr;
  std::size_t size_ = 0;
};

// `s` as a JSON string literal, quotes included: for paths and names in a config.
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The DLPack type of the C++ element type T (bool, integers, float, double).
template <typename T>
constexpr DLDataType dl_type_of() {
  static_assert(std::is_arithmetic_v<T> && !std::is_const_v<T>,
                "an element type is bool, an integer, float or double");
  constexpr auto bits = static_cast<std::uint8_t>(8 * sizeof(T));
  if constexpr (std::is_same_v<T, bool>) return DLDataType{6, 8, 1};
  else if constexpr (std::is_floating_point_v<T>) return DLDataType{2, bits, 1};
  else if constexpr (std::is_signed_v<T>) return DLDataType{0, bits, 1};
  else return DLDataType{1, bits, 1};
}

// The numpy name of a DLPack type ("float32", "int16", "bool", ...), as chunks name theirs.
inline std::string dtype_name(DLDataType t) {
  std::string kind;
  switch (t.code) {
    case 0: kind = "int"; break;
    case 1: kind = "uint"; break;
    case 2: kind = "float"; break;
    case 5: kind = "complex"; break;
    case 6: return "bool";
    default: kind = "dlpack_code" + std::to_string(t.code) + "_"; break;
  }
  std::string name = kind + std::to_string(t.bits);
  return t.lanes == 1 ? name : name + "x" + std::to_string(t.lanes);
}

namespace detail {

// Runs `call(&err)` and throws Error naming `name` unless it returns ISB_OK or one of the
// statuses the caller expects (`also_fine`, `or_this`).
template <typename Call>
IsbStatus check(const char *name, Call &&call, IsbStatus also_fine = ISB_OK,
                IsbStatus or_this = ISB_OK) {
  IsbError *err = nullptr;
  const IsbStatus status = call(&err);
  std::unique_ptr<IsbError, void (*)(IsbError *)> owned(err, isb_error_free);
  if (status == ISB_OK || status == also_fine || status == or_this) return status;
  throw Error(name, status, err ? isb_error_message(err) : "no message from the library");
}

// Runs `call(&out, &err)`, which returns a library string, and copies it out.
template <typename Call>
std::string string_result(const char *name, Call &&call) {
  char *raw = nullptr;
  check(name, [&](IsbError **err) { return call(&raw, err); });
  std::unique_ptr<char, void (*)(char *)> owned(raw, isb_string_free);
  return raw ? std::string(raw) : std::string();
}

// Throws std::logic_error when a moved-from or released handle is used.
template <typename P>
P *live(P *handle, const char *what) {
  if (!handle) throw std::logic_error(std::string("insitubatch::") + what +
                                      " is empty (moved from or released)");
  return handle;
}

// A move-only owner of one library handle, freed with `Free` (which accepts NULL).
template <typename T, void (*Free)(T *)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T *handle) noexcept : h_(handle) {}
  Handle(Handle &&other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  Handle &operator=(Handle &&other) noexcept {
    if (this != &other) {
      Free(h_);
      h_ = std::exchange(other.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle &) = delete;
  Handle &operator=(const Handle &) = delete;
  ~Handle() { Free(h_); }

  explicit operator bool() const noexcept { return h_ != nullptr; }
  T *get() const noexcept { return h_; }
  // Gives the handle up, for a caller that frees it itself.
  T *release() noexcept { return std::exchange(h_, nullptr); }

 protected:
  T *h_ = nullptr;
};

// Milliseconds for a timeout, rounded up, negative as zero.
template <typename Rep, typename Period>
std::uint64_t timeout_ms(std::chrono::duration<Rep, Period> d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return ms > 0 ? static_cast<std::uint64_t>(ms) : 0;
}

}  // namespace detail

// Geometries of the data variables of `store` as JSON (isb_open_geometries_with):
// `params_json` may give "sample_axis" and "storage_options".
inline std::string geometries_json(const std::string &store,
                                   const std::string &params_json = "{}") {
  return detail::string_result("isb_open_geometries_with", [&](char **out, IsbError **err) {
    return isb_open_geometries_with(store.c_str(), params_json.c_str(), out, err);
  });
}

// A field region from coordinate values as JSON (isb_coordinate_region): `params_json` such as
// {"array": "t2m", "bounds": {"latitude": [72, 35]}} gives {"region": [[...]], "wrap": false}.
inline std::string coordinate_region_json(const std::string &store,
                                          const std::string &params_json) {
  return detail::string_result("isb_coordinate_region", [&](char **out, IsbError **err) {
    return isb_coordinate_region(store.c_str(), params_json.c_str(), out, err);
  });
}

// The values of one dimension's coordinate array as JSON (isb_coordinate_values): `params_json`
// such as {"array": "t2m"} (the sample axis's, usually time) or {"array": "t2m", "dimension":
// "latitude"}; gives {"dimension", "path", "dtype", "values", "attributes"}.
inline std::string coordinate_values_json(const std::string &store,
                                          const std::string &params_json) {
  return detail::string_result("isb_coordinate_values", [&](char **out, IsbError **err) {
    return isb_coordinate_values(store.c_str(), params_json.c_str(), out, err);
  });
}

// A split manifest as JSON (isb_split_by_chunk): `params_json` such as
// {"fractions": [0.8, 0.1, 0.1], "seed": 0}; `array` empty for the first data variable.
inline std::string split_by_chunk(const std::string &store, const std::string &params_json,
                                  const std::string &array = "") {
  return detail::string_result("isb_split_by_chunk", [&](char **out, IsbError **err) {
    return isb_split_by_chunk(store.c_str(), array.empty() ? nullptr : array.c_str(),
                              params_json.c_str(), out, err);
  });
}

// Throws Error unless the library's ABI is the one this header was written for.
inline void check_abi() {
  const std::uint32_t library = isb_abi_version();
  if (library != ISB_ABI_VERSION) {
    throw Error("isb_abi_version", ISB_UNSUPPORTED,
                "libinsitubatch has ABI " + std::to_string(library) + ", insitubatch.h has " +
                    std::to_string(ISB_ABI_VERSION) +
                    ": build against the header that came with the library");
  }
}

// A DLPack tensor exported from a batch: it aliases the batch buffer and keeps it alive until
// it is destroyed (or released to a framework that takes DLPack).
class Tensor : public detail::Handle<DLManagedTensorVersioned, isb_dlpack_delete> {
 public:
  using Handle::Handle;

  const DLTensor &dl() const { return detail::live(h_, "Tensor")->dl_tensor; }
  int ndim() const { return dl().ndim; }
  std::vector<std::int64_t> shape() const {
    const DLTensor &t = dl();
    return std::vector<std::int64_t>(t.shape, t.shape + t.ndim);
  }
  // Elements, the product of the shape.
  std::size_t size() const {
    const DLTensor &t = dl();
    std::size_t n = 1;
    for (int d = 0; d < t.ndim; d++) n *= static_cast<std::size_t>(t.shape[d]);
    return n;
  }
  std::size_t nbytes() const { return size() * ((dl().dtype.bits + 7) / 8) * dl().dtype.lanes; }
  DLDataType dtype() const { return dl().dtype; }
  std::string dtype_name() const { return insitubatch::dtype_name(dtype()); }

  // The elements, C order, after checking that they are of type T (std::invalid_argument
  // naming both types if not).
  template <typename T>
  T *data() const {
    const DLDataType want = dl_type_of<std::remove_const_t<T>>();
    const DLDataType have = dtype();
    if (have.code != want.code || have.bits != want.bits || have.lanes != want.lanes) {
      throw std::invalid_argument("insitubatch::Tensor::data: the tensor holds " +
                                  dtype_name() + ", not " + insitubatch::dtype_name(want));
    }
    return reinterpret_cast<T *>(static_cast<char *>(dl().data) + dl().byte_offset);
  }
};

// One batch: rows of every label, and the sample each row holds.
class Batch : public detail::Handle<IsbBatch, isb_batch_free> {
 public:
  using Handle::Handle;

  // Rows.
  std::size_t size() const {
    std::size_t n = 0;
    detail::check("isb_batch_len", [&](IsbError **err) { return isb_batch_len(h_, &n, err); });
    return n;
  }

  // The sample (anchor) each row holds; valid while this batch lives.
  Span<std::uint64_t> sample_indices() const {
    const std::uint64_t *indices = nullptr;
    std::size_t n = 0;
    detail::check("isb_batch_sample_indices", [&](IsbError **err) {
      return isb_batch_sample_indices(h_, &indices, &n, err);
    });
    return Span<std::uint64_t>(indices, n);
  }

  // Where each row's patch was cut (a dataset with "patch"): row-major, one index per patched
  // axis per row; empty without a patch. Valid while this batch lives.
  Span<std::uint64_t> patch_origins() const {
    const std::uint64_t *origins = nullptr;
    std::size_t n = 0;
    detail::check("isb_batch_patch_origins", [&](IsbError **err) {
      return isb_batch_patch_origins(h_, &origins, &n, err);
    });
    return Span<std::uint64_t>(origins, n);
  }

  // Where the batch sits: its epoch, and its index in that whole epoch (also when the iteration
  // was resumed part-way). A checkpoint saving {epoch, index + 1} resumes after this batch with
  // set_epoch(epoch) and iter(split, index + 1).
  struct Position {
    std::uint64_t epoch = 0;
    std::uint64_t index = 0;
  };
  Position position() const {
    Position p;
    detail::check("isb_batch_position", [&](IsbError **err) {
      return isb_batch_position(h_, &p.epoch, &p.index, err);
    });
    return p;
  }

  // The names of the batch's arrays, in the dataset's order: each label's own, and a stack's
  // name (the config's "stacks") in the place of its labels.
  std::vector<std::string> labels() const {
    std::size_t n = 0;
    detail::check("isb_batch_label_count",
                  [&](IsbError **err) { return isb_batch_label_count(h_, &n, err); });
    std::vector<std::string> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; i++) {
      const char *label = nullptr;
      detail::check("isb_batch_label",
                    [&](IsbError **err) { return isb_batch_label(h_, i, &label, err); });
      out.emplace_back(label);
    }
    return out;
  }

  // The array of `label`, shaped (rows, *sample inner shape), or (rows, channels, *sample inner
  // shape) for a stack's name, without a copy.
  Tensor tensor(const std::string &label) const {
    DLManagedTensorVersioned *t = nullptr;
    detail::check("isb_batch_export",
                  [&](IsbError **err) { return isb_batch_export(h_, label.c_str(), &t, err); });
    return Tensor(t);
  }
};

// What Iter::next_for came to: a batch, the end of the epoch, or no batch in time.
struct Waited {
  std::optional<Batch> batch;
  bool timed_out = false;
  bool end_of_epoch() const noexcept { return !batch && !timed_out; }
};

// One epoch over one split. Used by one thread at a time; range-for yields its batches.
// Destroying it before the epoch is over stops the pass and frees everything it held.
class Iter : public detail::Handle<IsbIter, isb_iter_free> {
 public:
  using Handle::Handle;

  // The next batch, or nothing at the end of the epoch; waits as long as the batch takes.
  std::optional<Batch> next() {
    IsbBatch *b = nullptr;
    const IsbStatus status =
        detail::check("isb_iter_next", [&](IsbError **err) { return isb_iter_next(h_, &b, err); },
                      ISB_END_OF_EPOCH);
    if (status == ISB_END_OF_EPOCH) return std::nullopt;
    return Batch(b);
  }

  // next(), waiting at most `timeout` (rounded up to milliseconds). No batch in time is not an
  // error: the epoch goes on and nothing is lost; call again.
  template <typename Rep, typename Period>
  Waited next_for(std::chrono::duration<Rep, Period> timeout) {
    IsbBatch *b = nullptr;
    const std::uint64_t ms = detail::timeout_ms(timeout);
    const IsbStatus status = detail::check(
        "isb_iter_next_timeout",
        [&](IsbError **err) { return isb_iter_next_timeout(h_, ms, &b, err); },
        ISB_END_OF_EPOCH, ISB_TIMED_OUT);
    Waited waited;
    if (status == ISB_OK) waited.batch.emplace(b);
    waited.timed_out = status == ISB_TIMED_OUT;
    return waited;
  }

  // The iteration's report as JSON (hits, misses, bytes, latency percentiles, bad chunks, ...).
  std::string stats_json() const {
    return detail::string_result("isb_iter_stats_json", [&](char **out, IsbError **err) {
      return isb_iter_stats_json(h_, out, err);
    });
  }

  // An input iterator over the remaining batches, like std::istream_iterator: its copies
  // share this iteration, which holds the current batch; each step frees the batch before it
  // (its exported tensors stay valid).
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch *;
    using reference = Batch &;

    iterator() = default;
    Batch &operator*() const { return *iter_->current_; }
    Batch *operator->() const { return &*iter_->current_; }
    iterator &operator++() {
      iter_->current_ = iter_->next();
      if (!iter_->current_) iter_ = nullptr;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(const iterator &other) const noexcept { return iter_ == other.iter_; }
    bool operator!=(const iterator &other) const noexcept { return iter_ != other.iter_; }

   private:
    friend class Iter;
    explicit iterator(Iter *iter) noexcept : iter_(iter) {}
    Iter *iter_ = nullptr;
  };
  iterator begin() {
    detail::live(h_, "Iter");
    iterator first(this);
    ++first;
    return first;
  }
  iterator end() noexcept { return iterator(); }

  Iter() = default;
  Iter(Iter &&other) noexcept = default;
  // The current batch goes before the iteration it came from (as in the destructor, where
  // members go before the base).
  Iter &operator=(Iter &&other) noexcept {
    if (this != &other) {
      current_.reset();
      Handle::operator=(std::move(other));
      current_ = std::move(other.current_);
    }
    return *this;
  }
  ~Iter() = default;

 private:
  std::optional<Batch> current_;  // the batch a range-for is on
};

// One chunk as a transform sees it (insitubatch.h's IsbChunk): the input, or the output to fill.
class Chunk {
 public:
  explicit Chunk(const IsbChunk &c) noexcept : c_(&c) {}
  // The array's path.
  std::string_view array() const noexcept { return c_->array; }
  // Its index along the sample axis: its first row is sample index() * shape()[0].
  std::uint64_t index() const noexcept { return c_->index; }
  // [samples in the chunk, *inner shape].
  Span<std::uint64_t> shape() const noexcept { return Span<std::uint64_t>(c_->shape, c_->ndim); }
  std::string_view dtype() const noexcept { return c_->dtype; }
  std::size_t nbytes() const noexcept { return c_->nbytes; }
  // Elements, the product of the shape.
  std::size_t size() const noexcept {
    std::size_t n = 1;
    for (const std::uint64_t extent : shape()) n *= static_cast<std::size_t>(extent);
    return n;
  }
  // The raw bytes; the output and the input are one buffer when the transform runs in place.
  void *bytes() const noexcept { return c_->data; }

  // The elements, C order, after checking that they are of type T (std::invalid_argument
  // naming the array, the chunk and both types if not: the pass then fails with that message).
  template <typename T>
  T *data() const {
    const std::string want = dtype_name(dl_type_of<std::remove_const_t<T>>());
    if (dtype() != want) {
      throw std::invalid_argument("chunk " + std::to_string(index()) + " of " +
                                  std::string(array()) + " is " + std::string(dtype()) +
                                  ", not " + want);
    }
    return static_cast<T *>(c_->data);
  }

 private:
  const IsbChunk *c_;
};

// A chunk transform written in C++: reads `input`, writes `output`. It runs on the library's
// threads, several at once, so it must be thread-safe, and must not call this library. An
// exception it throws fails the pass with ISB_TRANSFORM and the exception's message.
using Transform = std::function<void(const Chunk &input, const Chunk &output)>;

namespace detail {

inline int32_t apply_transform(void *user_data, const IsbChunk *input, const IsbChunk *output,
                               char *message, std::size_t message_len) noexcept {
  // The message is copied inside each handler: the exception is gone once its handler ends.
  try {
    (*static_cast<Transform *>(user_data))(Chunk(*input), Chunk(*output));
    return 0;
  } catch (const std::exception &e) {
    if (message_len > 0) std::snprintf(message, message_len, "%s", e.what());
  } catch (...) {
    if (message_len > 0) {
      std::snprintf(message, message_len, "%s",
                    "the transform threw something that is not a std::exception");
    }
  }
  return 1;
}

inline void release_transform(void *user_data) noexcept {
  delete static_cast<Transform *>(user_data);
}

}  // namespace detail

// A dataset: a store, its variables, a split manifest and a chunk pool. Any thread may use it,
// several at once; it is closed when the object goes (the runtime stops once the last of its
// iterations and exported tensors is gone too).
class Dataset : public detail::Handle<IsbDataset, isb_dataset_free> {
 public:
  // Opens a dataset from its JSON config (docs/c-api.md, "Dataset config").
  static Dataset open(const std::string &config_json) {
    check_abi();
    IsbDataset *ds = nullptr;
    detail::check("isb_dataset_open", [&](IsbError **err) {
      return isb_dataset_open(config_json.c_str(), &ds, err);
    });
    return Dataset(ds);
  }

  // open() with chunk transforms written in C++: a config entry {"type": "callback",
  // "callback": i} runs transforms[i] (see docs/c-api.md, "Chunk transforms written in C").
  // The library keeps each callable until the dataset and everything using it are gone.
  static Dataset open(const std::string &config_json, std::vector<Transform> transforms) {
    check_abi();
    std::vector<std::unique_ptr<Transform>> owned;
    owned.reserve(transforms.size());
    for (Transform &t : transforms) {
      if (!t) throw std::invalid_argument("insitubatch::Dataset::open: transform " +
                                          std::to_string(owned.size()) + " is empty");
      owned.push_back(std::make_unique<Transform>(std::move(t)));
    }
    std::vector<IsbTransformCallback> callbacks(owned.size());
    // From the call on the library owns every callable, whatever it returns.
    for (std::size_t i = 0; i < owned.size(); i++) {
      callbacks[i] = IsbTransformCallback{detail::apply_transform, detail::release_transform,
                                          owned[i].release(), nullptr};
    }
    IsbDataset *ds = nullptr;
    detail::check("isb_dataset_open_with_transforms", [&](IsbError **err) {
      return isb_dataset_open_with_transforms(config_json.c_str(), callbacks.data(),
                                              callbacks.size(), &ds, err);
    });
    return Dataset(ds);
  }

  using Handle::Handle;

  // The epoch the next iteration draws; the order depends on (seed, epoch) only.
  void set_epoch(std::uint64_t epoch) const {
    detail::check("isb_dataset_set_epoch",
                  [&](IsbError **err) { return isb_dataset_set_epoch(h_, epoch, err); });
  }

  struct SplitLen {
    std::uint64_t samples = 0;  // every valid anchor once
    std::uint64_t batches = 0;  // ceil(samples / batch_size), only the last one short
  };
  // What one epoch of `split` yields.
  SplitLen split_len(const std::string &split) const {
    SplitLen len;
    detail::check("isb_dataset_split_len", [&](IsbError **err) {
      return isb_dataset_split_len(h_, split.c_str(), &len.samples, &len.batches, err);
    });
    return len;
  }

  struct Order {
    std::vector<std::uint64_t> samples;     // in the order the batches emit them
    std::vector<std::uint64_t> block_ends;  // where each shuffle block ends in `samples`
  };
  // The order the current epoch of `split` draws, planned without reading anything.
  Order order(const std::string &split) const {
    std::size_t n_samples = 0, n_blocks = 0;
    detail::check("isb_dataset_order", [&](IsbError **err) {
      return isb_dataset_order(h_, split.c_str(), nullptr, 0, &n_samples, nullptr, 0,
                               &n_blocks, err);
    });
    Order order;
    order.samples.resize(n_samples);
    order.block_ends.resize(n_blocks);
    detail::check("isb_dataset_order", [&](IsbError **err) {
      return isb_dataset_order(h_, split.c_str(), order.samples.data(), order.samples.size(),
                               &n_samples, order.block_ends.data(), order.block_ends.size(),
                               &n_blocks, err);
    });
    return order;
  }

  // The memory an iteration over `split` would hold at its peak, as JSON.
  std::string memory_json(const std::string &split) const {
    return detail::string_result("isb_dataset_memory_json", [&](char **out, IsbError **err) {
      return isb_dataset_memory_json(h_, split.c_str(), out, err);
    });
  }

  // Count, NaN count, mean, standard deviation, min and max of each batch array over one
  // epoch of `split`, as JSON (isb_statistics_new/add/json): `params_json` {"axis": k} gives
  // one entry per index along inner axis k of the rows, "{}" one over whole samples;
  // "quantiles": [0.01, 0.99] adds the values at those probabilities (ABI 23).
  std::string statistics_json(const std::string &split = "train",
                              const std::string &params_json = "{}") const {
    IsbStatistics *raw = nullptr;
    detail::check("isb_statistics_new", [&](IsbError **err) {
      return isb_statistics_new(h_, params_json.c_str(), &raw, err);
    });
    const detail::Handle<IsbStatistics, isb_statistics_free> stats(raw);
    Iter epoch = iter(split);
    while (std::optional<Batch> b = epoch.next()) {
      detail::check("isb_statistics_add", [&](IsbError **err) {
        return isb_statistics_add(stats.get(), b->get(), err);
      });
    }
    return detail::string_result("isb_statistics_json", [&](char **out, IsbError **err) {
      return isb_statistics_json(stats.get(), out, err);
    });
  }

  // Dataset facts and pool counters as JSON.
  std::string stats_json() const {
    return detail::string_result("isb_dataset_stats_json", [&](char **out, IsbError **err) {
      return isb_dataset_stats_json(h_, out, err);
    });
  }

  // An epoch of `split` ("train", "val", "test" or "all") at the current epoch, from batch
  // `start_batch` (a job resumed from a checkpoint; 0 for the whole epoch).
  Iter iter(const std::string &split, std::uint64_t start_batch = 0) const {
    IsbIter *it = nullptr;
    detail::check(start_batch == 0 ? "isb_iter_start" : "isb_iter_start_at",
                  [&](IsbError **err) {
                    return start_batch == 0
                               ? isb_iter_start(h_, split.c_str(), &it, err)
                               : isb_iter_start_at(h_, split.c_str(), start_batch, &it, err);
                  });
    return Iter(it);
  }
};

// Stops every callback transform of the process for good, waiting up to `timeout` for those
// running (isb_callbacks_shutdown): false when some were still running at the deadline.
template <typename Rep, typename Period>
bool shutdown_callbacks(std::chrono::duration<Rep, Period> timeout) {
  return detail::check("isb_callbacks_shutdown",
                       [&](IsbError **err) {
                         return isb_callbacks_shutdown(detail::timeout_ms(timeout), err);
                       },
                       ISB_TIMED_OUT) == ISB_OK;
}

}  // namespace insitubatch

#endif  // INSITUBATCH_HPP
