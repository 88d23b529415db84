/* The C ABI under threads: what a C or C++ host may do from several threads, checked for exact
 * results. Compiled and run by tests/tests/c_abi.rs on each IO backend; prints
 * "reference <hash>" (the Rust test computes the same hash with the Rust API) and then "ok"
 * when every check passed.
 *
 * 1. Several threads share one iteration: each asks for batches with short bounded waits, a
 *    call that meets another thread inside the iteration is ISB_INVALID_ARGUMENT and is retried,
 *    and batches are freed by whichever thread pops them from a hand-off ring. Every train
 *    sample arrives exactly once, with the bytes of the reference pass.
 * 2. Every thread opens its own dataset over the same store and runs two epochs, shuffled or
 *    not, each with its own seed; the last
 *    batch's tensor is exported, outlives its dataset, and keeps its bytes.
 * 3. One dataset, one iteration per split on its own thread, started together (the budget
 *    holds all three); the dataset handle is freed while they run.
 *
 * Usage: threads STORE THREADS */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "insitubatch.h"

#define MAX_SAMPLES 4096
#define RING 8

static const char *store;
static int n_threads;
static uint64_t reference[MAX_SAMPLES]; /* per-sample row hash; 0 = not in the store */
static size_t n_samples;
static _Atomic int failures;
static char split_cfg[12288]; /* `, "manifest": {...}`: a 60/20/20 split of raw's chunks */

#define FAIL(...)                          \
    do {                                   \
        fprintf(stderr, "FAIL " __VA_ARGS__); \
        failures++;                        \
    } while (0)

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static size_t row_bytes(const DLTensor *t) {
    size_t n = (size_t)(t->dtype.bits / 8) * t->dtype.lanes;
    for (int d = 1; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Row hashes of a batch: every label's row bytes, labels in the batch's order. Returns the
 * row count, or 0 after reporting a failure. */
static size_t batch_rows(IsbBatch *b, uint64_t *indices, uint64_t *hashes) {
    size_t n = 0, labels = 0;
    const uint64_t *idx = NULL;
    IsbError *err = NULL;
    if (isb_batch_sample_indices(b, &idx, &n, &err) != ISB_OK || n > 64 ||
        isb_batch_label_count(b, &labels, &err) != ISB_OK) {
        FAIL("batch accessors (%zu rows): %s\n", n, isb_error_message(err));
        isb_error_free(err);
        return 0;
    }
    memcpy(indices, idx, n * sizeof *idx);
    for (size_t r = 0; r < n; r++) hashes[r] = 14695981039346656037ull;
    for (size_t l = 0; l < labels; l++) {
        const char *label = NULL;
        DLManagedTensorVersioned *t = NULL;
        if (isb_batch_label(b, l, &label, &err) != ISB_OK || isb_batch_export(b, label, &t, &err) != ISB_OK) {
            FAIL("export: %s\n", isb_error_message(err));
            isb_error_free(err);
            return 0;
        }
        size_t rb = row_bytes(&t->dl_tensor);
        for (size_t r = 0; r < n; r++)
            hashes[r] = fnv(hashes[r], (const unsigned char *)t->dl_tensor.data + r * rb, rb);
        t->deleter(t);
    }
    return n;
}

static IsbDataset *open_ds(const char *extra) {
    static _Thread_local char config[16384];
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"raw\", \"mask\"], \"batch_size\": 3%s}", store, extra);
    IsbDataset *ds = NULL;
    IsbError *err = NULL;
    if (isb_dataset_open(config, &ds, &err) != ISB_OK) {
        FAIL("open %s: %s\n", config, isb_error_message(err));
        isb_error_free(err);
        return NULL;
    }
    return ds;
}

/* Checks a batch's rows against the reference and counts each sample in `seen`. */
static void check_rows(const char *who, IsbBatch *b, _Atomic int *seen) {
    uint64_t idx[64], h[64];
    size_t n = batch_rows(b, idx, h);
    for (size_t r = 0; r < n; r++) {
        if (idx[r] >= n_samples || h[r] != reference[idx[r]])
            FAIL("%s: sample %llu has other bytes than the reference pass\n", who, (unsigned long long)idx[r]);
        else
            seen[idx[r]]++;
    }
}

/* Every sample of `split`'s reference set seen once: `want[i]` says which are in the split. */
static void check_once(const char *who, _Atomic int *seen, const char *want) {
    for (size_t i = 0; i < n_samples; i++)
        if (seen[i] != (want[i] ? 1 : 0))
            FAIL("%s: sample %zu delivered %d times, want %d\n", who, i, (int)seen[i], want[i] ? 1 : 0);
}

/* The samples a split holds, from one plain pass (asserted elsewhere to be the manifest's). */
static void split_members(IsbDataset *ds, const char *split, char *member) {
    memset(member, 0, MAX_SAMPLES);
    IsbIter *it = NULL;
    IsbBatch *b = NULL;
    IsbError *err = NULL;
    if (isb_iter_start(ds, split, &it, &err) != ISB_OK) {
        FAIL("start %s: %s\n", split, isb_error_message(err));
        isb_error_free(err);
        return;
    }
    IsbStatus st;
    while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) {
        const uint64_t *idx = NULL;
        size_t n = 0;
        isb_batch_sample_indices(b, &idx, &n, NULL);
        for (size_t r = 0; r < n; r++) member[idx[r]] = 1;
        isb_batch_free(b);
    }
    if (st != ISB_END_OF_EPOCH) FAIL("members of %s: %s\n", split, isb_error_message(err));
    isb_error_free(err);
    isb_iter_free(it);
}

/* ---- 1. one iteration, many threads ---- */

static IsbIter *shared_it;
static _Atomic int shared_seen[MAX_SAMPLES];
static _Atomic int shared_done;
static _Atomic long contended;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static IsbBatch *ring[RING];
static int ring_len;

static void *shared_worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!shared_done) {
        IsbBatch *b = NULL;
        IsbError *err = NULL;
        IsbStatus st = isb_iter_next_timeout(shared_it, rand_r(&seed) % 3, &b, &err);
        if (st == ISB_OK) {
            check_rows("shared iteration", b, shared_seen);
            /* Hand the batch to the ring; whoever finds it full frees what is there. */
            pthread_mutex_lock(&ring_lock);
            if (ring_len == RING) {
                for (int i = 0; i < RING; i++) isb_batch_free(ring[i]);
                ring_len = 0;
            }
            ring[ring_len++] = b;
            pthread_mutex_unlock(&ring_lock);
        } else if (st == ISB_END_OF_EPOCH) {
            shared_done = 1;
        } else if (st == ISB_INVALID_ARGUMENT && strstr(isb_error_message(err), "another thread")) {
            contended++;
            sched_yield();
        } else if (st != ISB_TIMED_OUT) {
            FAIL("shared iteration: status %u: %s\n", (unsigned)st, isb_error_message(err));
            shared_done = 1;
        }
        isb_error_free(err);
    }
    return NULL;
}

/* ---- 2. a dataset per thread ---- */

struct own {
    int id;
    const char *train;
    DLManagedTensorVersioned *kept;
    unsigned char first[64];
};

static void *own_worker(void *arg) {
    struct own *o = arg;
    char extra[sizeof split_cfg + 64];
    snprintf(extra, sizeof extra, "%s, \"seed\": %d, \"shuffle\": %s", split_cfg, o->id, o->id % 2 ? "true" : "false");
    IsbDataset *ds = open_ds(extra);
    if (!ds) return NULL;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        _Atomic int seen[MAX_SAMPLES] = {0};
        IsbIter *it = NULL;
        IsbError *err = NULL;
        isb_dataset_set_epoch(ds, epoch, NULL);
        if (isb_iter_start(ds, "train", &it, &err) != ISB_OK) {
            FAIL("thread %d start: %s\n", o->id, isb_error_message(err));
            isb_error_free(err);
            break;
        }
        IsbBatch *b = NULL, *last = NULL;
        IsbStatus st;
        while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) {
            check_rows("own dataset", b, seen);
            isb_batch_free(last);
            last = b;
        }
        if (st != ISB_END_OF_EPOCH) FAIL("thread %d: %s\n", o->id, isb_error_message(err));
        isb_error_free(err);
        check_once("own dataset", seen, o->train);
        if (epoch == 1 && last) {
            const char *label = NULL;
            isb_batch_label(last, 0, &label, NULL);
            if (isb_batch_export(last, label, &o->kept, NULL) == ISB_OK)
                memcpy(o->first, o->kept->dl_tensor.data, sizeof o->first);
        }
        isb_batch_free(last);
        isb_iter_free(it);
    }
    isb_dataset_free(ds); /* the exported tensor keeps its buffer alive */
    return NULL;
}

/* ---- 3. one iteration per split, the dataset freed under them ---- */

struct split_run {
    IsbIter *it;
    const char *name;
    const char *want;
    _Atomic int seen[MAX_SAMPLES];
};

static void *split_worker(void *arg) {
    struct split_run *s = arg;
    IsbBatch *b = NULL;
    IsbError *err = NULL;
    IsbStatus st;
    while ((st = isb_iter_next(s->it, &b, &err)) == ISB_OK) {
        check_rows(s->name, b, s->seen);
        isb_batch_free(b);
    }
    if (st != ISB_END_OF_EPOCH) FAIL("%s: %s\n", s->name, isb_error_message(err));
    isb_error_free(err);
    isb_iter_free(s->it);
    check_once(s->name, s->seen, s->want);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    store = argv[1];
    n_threads = atoi(argv[2]);
    if (n_threads < 2 || n_threads > 32) return 2;

    /* The reference: one sequential pass over every sample. */
    IsbDataset *ds = open_ds(", \"shuffle\": false");
    if (!ds) return 1;
    IsbIter *it = NULL;
    IsbBatch *b = NULL;
    IsbError *err = NULL;
    if (isb_iter_start(ds, "all", &it, &err) != ISB_OK) return 1;
    uint64_t total = 0;
    while (isb_iter_next(it, &b, &err) == ISB_OK) {
        uint64_t idx[64], h[64];
        size_t n = batch_rows(b, idx, h);
        for (size_t r = 0; r < n; r++) {
            if (idx[r] >= MAX_SAMPLES) return 1;
            reference[idx[r]] = h[r];
            total += h[r];
            if (idx[r] + 1 > n_samples) n_samples = idx[r] + 1;
        }
        isb_batch_free(b);
    }
    isb_error_free(err);
    isb_iter_free(it);
    printf("reference %llu\n", (unsigned long long)total);
    static char train[MAX_SAMPLES], val[MAX_SAMPLES], test[MAX_SAMPLES];
    isb_dataset_free(ds);

    /* 1. One iteration, n_threads threads. */
    char *manifest = NULL;
    if (isb_split_by_chunk(store, "raw", "{\"fractions\": [0.6, 0.2, 0.2], \"seed\": 5}", &manifest, &err) != ISB_OK ||
        strlen(manifest) + 32 > sizeof split_cfg) {
        fprintf(stderr, "split: %s\n", isb_error_message(err));
        return 1;
    }
    snprintf(split_cfg, sizeof split_cfg, ", \"manifest\": %s", manifest);
    isb_string_free(manifest);
    ds = open_ds(split_cfg);
    if (!ds) return 1;
    split_members(ds, "train", train);
    split_members(ds, "val", val);
    split_members(ds, "test", test);
    isb_dataset_set_epoch(ds, 1, NULL);
    if (isb_iter_start(ds, "train", &shared_it, &err) != ISB_OK) return 1;
    pthread_t th[32];
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, shared_worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < ring_len; i++) isb_batch_free(ring[i]);
    isb_iter_free(shared_it);
    check_once("shared iteration", shared_seen, train);
    isb_dataset_free(ds);

    /* 2. A dataset per thread, over the same manifest. */
    struct own owns[32];
    for (int i = 0; i < n_threads; i++) {
        owns[i] = (struct own){.id = i, .train = train};
        pthread_create(&th[i], NULL, own_worker, &owns[i]);
    }
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n_threads; i++) {
        if (!owns[i].kept) {
            FAIL("thread %d exported no tensor\n", i);
            continue;
        }
        if (memcmp(owns[i].first, owns[i].kept->dl_tensor.data, sizeof owns[i].first) != 0)
            FAIL("thread %d: an exported tensor changed after its dataset was freed\n", i);
        owns[i].kept->deleter(owns[i].kept);
    }

    /* 3. train, val and test at once on one dataset, which is freed while they run. */
    char extra[sizeof split_cfg + 64];
    snprintf(extra, sizeof extra, "%s, \"cache_budget_bytes\": 100000000", split_cfg);
    ds = open_ds(extra);
    if (!ds) return 1;
    static struct split_run runs[3];
    const char *names[3] = {"train", "val", "test"};
    const char *wants[3] = {train, val, test};
    for (int i = 0; i < 3; i++) {
        runs[i].name = names[i];
        runs[i].want = wants[i];
        if (isb_iter_start(ds, names[i], &runs[i].it, &err) != ISB_OK) {
            FAIL("start %s: %s\n", names[i], isb_error_message(err));
            return 1;
        }
    }
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, split_worker, &runs[i]);
    isb_dataset_free(ds);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);

    fprintf(stderr, "shared iteration: %ld calls met another thread\n", (long)contended);
    if (failures == 0) printf("ok\n");
    return failures ? 1 : 0;
}
