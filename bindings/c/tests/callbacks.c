/* Chunk transforms written in C (isb_dataset_open_with_transforms): values against the
 * built-in they imitate and against the untransformed data, what a callback is shown, failures,
 * bad entries, `release` exactly once, and isb_callbacks_shutdown. Compiled and run by
 * tests/tests/c_abi.rs with the era5_v3 fixture (t2m: 12 x 9 x 16 float32 in chunks of 4);
 * prints "ok" when every check passed. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "insitubatch.h"

static int failures = 0;

#define EXPECT(cond, ...)                                  \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "FAIL line %d: ", __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                  \
            fprintf(stderr, "\n");                         \
            failures++;                                    \
        }                                                  \
    } while (0)

/* What a callback saw, and how often it was released. */
typedef struct {
    float scale, offset;
    atomic_int calls;
    atomic_ulong index_sum;
    atomic_int bad_input; /* a chunk that was not t2m's [4, 9, 16] float32, or out != in */
    atomic_int released;
    atomic_int thread_exits;
    atomic_int exits_before_release; /* thread_exits seen by release */
} State;

static void release(void *user_data) {
    State *s = user_data;
    atomic_store(&s->exits_before_release, atomic_load(&s->thread_exits));
    atomic_fetch_add(&s->released, 1);
}

static void thread_exit(void *user_data) { atomic_fetch_add(&((State *)user_data)->thread_exits, 1); }

/* x * scale + offset, in place: what the built-in `affine` computes. */
static int32_t scale_offset(void *user_data, const IsbChunk *in, const IsbChunk *out, char *msg, size_t len) {
    (void)msg;
    (void)len;
    State *s = user_data;
    atomic_fetch_add(&s->calls, 1);
    atomic_fetch_add(&s->index_sum, in->index);
    if (strcmp(in->array, "t2m") != 0 || in->ndim != 3 || in->shape[0] != 4 || in->shape[1] != 9 ||
        in->shape[2] != 16 || strcmp(in->dtype, "float32") != 0 || in->nbytes != 4 * 9 * 16 * 4 ||
        out->data != in->data || out->nbytes != in->nbytes)
        atomic_fetch_add(&s->bad_input, 1);
    float *v = out->data;
    for (size_t i = 0; i < out->nbytes / sizeof(float); i++) v[i] = v[i] * s->scale + s->offset;
    return 0;
}

/* Each sample's row means over longitude, as float64: a sample becomes [9]. */
static int32_t row_means(void *user_data, const IsbChunk *in, const IsbChunk *out, char *msg, size_t len) {
    (void)msg;
    (void)len;
    State *s = user_data;
    atomic_fetch_add(&s->calls, 1);
    if (out->ndim != 2 || out->shape[0] != in->shape[0] || out->shape[1] != 9 ||
        strcmp(out->dtype, "float64") != 0 || out->data == in->data ||
        out->nbytes != in->shape[0] * 9 * sizeof(double))
        atomic_fetch_add(&s->bad_input, 1);
    const float *x = in->data;
    double *y = out->data;
    for (uint64_t r = 0; r < in->shape[0] * 9; r++) {
        double sum = 0;
        for (int c = 0; c < 16; c++) sum += x[r * 16 + c];
        y[r] = sum / 16;
    }
    return 0;
}

/* Tries to iterate its own dataset from inside the decoder: refused, never a hang. */
typedef struct {
    IsbDataset *ds;
    atomic_int calls;
    atomic_int refused; /* isb_iter_start said ISB_INVALID_ARGUMENT naming the cause */
} Nested;

static int32_t iterate_own_dataset(void *user_data, const IsbChunk *in, const IsbChunk *out, char *msg, size_t len) {
    (void)in;
    (void)out;
    (void)msg;
    (void)len;
    Nested *n = user_data;
    atomic_fetch_add(&n->calls, 1);
    IsbIter *it = NULL;
    IsbError *err = NULL;
    IsbStatus st = isb_iter_start(n->ds, "all", &it, &err);
    if (st == ISB_INVALID_ARGUMENT && strstr(isb_error_message(err), "must not iterate a dataset"))
        atomic_fetch_add(&n->refused, 1);
    isb_error_free(err);
    isb_iter_free(it);
    return 0;
}

static int32_t refuse(void *user_data, const IsbChunk *in, const IsbChunk *out, char *msg, size_t len) {
    (void)out;
    atomic_fetch_add(&((State *)user_data)->calls, 1);
    snprintf(msg, len, "no station data in chunk %llu", (unsigned long long)in->index);
    return 7;
}

/* Every value of label `label` over one sequential pass, in order, as doubles (float32 or
 * float64 batches); the count through `n`. NULL and a printed error when the pass fails. */
static double *values(IsbDataset *ds, const char *label, size_t *n, IsbStatus *failed, char *why, size_t why_len) {
    IsbError *err = NULL;
    IsbIter *it = NULL;
    *n = 0;
    *failed = ISB_OK;
    if (isb_iter_start(ds, "all", &it, &err) != ISB_OK) {
        fprintf(stderr, "iter_start: %s\n", isb_error_message(err));
        isb_error_free(err);
        return NULL;
    }
    double *out = malloc(12 * 9 * 16 * sizeof(double));
    IsbBatch *b = NULL;
    IsbStatus st;
    while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) {
        DLManagedTensorVersioned *t = NULL;
        if (isb_batch_export(b, label, &t, NULL) != ISB_OK) abort();
        size_t count = 1;
        for (int d = 0; d < t->dl_tensor.ndim; d++) count *= (size_t)t->dl_tensor.shape[d];
        for (size_t i = 0; i < count; i++)
            out[(*n)++] = t->dl_tensor.dtype.bits == 64 ? ((const double *)t->dl_tensor.data)[i]
                                                        : ((const float *)t->dl_tensor.data)[i];
        t->deleter(t);
        isb_batch_free(b);
    }
    if (st != ISB_END_OF_EPOCH) {
        *failed = st;
        snprintf(why, why_len, "%s", isb_error_message(err));
        isb_error_free(err);
        free(out);
        out = NULL;
    }
    isb_iter_free(it);
    return out;
}

static IsbDataset *open_t2m(const char *store, const char *transforms, IsbTransformCallback *cbs, size_t n,
                            IsbStatus *status, char *why, size_t why_len) {
    char config[2048];
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"batch_size\": 5, \"shuffle\": false, \"executor_threads\": 2, "
             "\"chunk_transforms\": %s}",
             store, transforms);
    IsbDataset *ds = NULL;
    IsbError *err = NULL;
    *status = isb_dataset_open_with_transforms(config, cbs, n, &ds, &err);
    if (*status != ISB_OK) {
        snprintf(why, why_len, "%s", isb_error_message(err));
        isb_error_free(err);
    }
    return ds;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *store = argv[1];
    char why[1024];
    IsbStatus st, failed;
    size_t n_plain = 0, n = 0;

    IsbDataset *plain = open_t2m(store, "[]", NULL, 0, &st, why, sizeof why);
    EXPECT(st == ISB_OK, "open plain: %s", why);
    double *raw = values(plain, "t2m", &n_plain, &failed, why, sizeof why);
    EXPECT(raw && n_plain == 12 * 9 * 16, "plain pass: %zu values", n_plain);

    /* 1. In place, against the built-in affine: the same bits. */
    {
        State s = {.scale = 0.5f, .offset = -273.15f};
        IsbTransformCallback cb = {.apply = scale_offset, .release = release, .user_data = &s, .thread_exit = thread_exit};
        IsbDataset *ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0, \"identity\": \"k_to_c v1\"}]",
                                  &cb, 1, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open with a callback: %s", why);
        IsbDataset *builtin = open_t2m(store, "[{\"type\": \"affine\", \"scale\": 0.5, \"offset\": -273.15}]",
                                       NULL, 0, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open with affine: %s", why);
        double *got = values(ds, "t2m", &n, &failed, why, sizeof why);
        size_t n_want = 0;
        double *want = values(builtin, "t2m", &n_want, &failed, why, sizeof why);
        EXPECT(got && want && n == n_plain && n_want == n_plain, "passes: %zu and %zu values", n, n_want);
        for (size_t i = 0; got && want && i < n; i++)
            if (got[i] != want[i] || got[i] != (double)((float)raw[i] * 0.5f + -273.15f)) {
                EXPECT(0, "value %zu: callback %.9g, affine %.9g, raw %.9g", i, got[i], want[i], raw[i]);
                break;
            }
        /* Once per chunk (0, 1, 2), read-once: the pass is the chunks' only reader. */
        EXPECT(atomic_load(&s.calls) == 3 && atomic_load(&s.index_sum) == 3, "calls %d, index sum %lu",
               atomic_load(&s.calls), atomic_load(&s.index_sum));
        EXPECT(atomic_load(&s.bad_input) == 0, "the callback was shown something other than t2m's chunk");
        free(got);
        free(want);
        EXPECT(atomic_load(&s.released) == 0, "released while the dataset is open");
        isb_dataset_free(ds);
        isb_dataset_free(builtin);
        EXPECT(atomic_load(&s.released) == 1, "released %d times after isb_dataset_free", atomic_load(&s.released));
        /* Once per library thread that ran it (two executors: one or both), each before the release. */
        int exits = atomic_load(&s.thread_exits);
        EXPECT(exits >= 1 && exits <= 2 && atomic_load(&s.exits_before_release) == exits,
               "thread_exit %d times, %d before release", exits, atomic_load(&s.exits_before_release));
    }

    /* 2. A new shape and dtype, declared: batches are (rows, 9) float64 row means. */
    {
        State s = {0};
        IsbTransformCallback cb = {.apply = row_means, .release = release, .user_data = &s};
        IsbDataset *ds = open_t2m(store,
                                  "[{\"type\": \"callback\", \"callback\": 0, \"shape\": [9], \"dtype\": \"float64\"}]",
                                  &cb, 1, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open row means: %s", why);
        double *got = values(ds, "t2m", &n, &failed, why, sizeof why);
        EXPECT(got && n == 12 * 9, "row means: %zu values", n);
        for (size_t r = 0; got && r < 12 * 9; r++) {
            double sum = 0;
            for (int c = 0; c < 16; c++) sum += (float)raw[r * 16 + c];
            if (got[r] != sum / 16) {
                EXPECT(0, "row %zu: %.17g, want %.17g", r, got[r], sum / 16);
                break;
            }
        }
        EXPECT(atomic_load(&s.calls) == 3 && atomic_load(&s.bad_input) == 0, "calls %d, bad %d",
               atomic_load(&s.calls), atomic_load(&s.bad_input));
        free(got);
        isb_dataset_free(ds);
        EXPECT(atomic_load(&s.released) == 1, "released %d times", atomic_load(&s.released));
    }

    /* 3. A callback that fails: the pass ends with ISB_TRANSFORM, its message and the chunk. */
    {
        State s = {0};
        IsbTransformCallback cb = {.apply = refuse, .release = release, .user_data = &s};
        IsbDataset *ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0}]", &cb, 1, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open refuse: %s", why);
        double *got = values(ds, "t2m", &n, &failed, why, sizeof why);
        EXPECT(!got && failed == ISB_TRANSFORM, "status %u", (unsigned)failed);
        EXPECT(strstr(why, "returned 7: no station data in chunk") && strstr(why, "`t2m`") &&
                   strstr(why, "callback"),
               "message: %s", why);
        isb_dataset_free(ds);
        EXPECT(atomic_load(&s.released) == 1, "released %d times", atomic_load(&s.released));
    }

    /* 3b. A callback that starts an iteration of its own dataset gets an error at once. */
    {
        Nested nested = {0};
        IsbTransformCallback cb = {.apply = iterate_own_dataset, .release = NULL, .user_data = &nested};
        IsbDataset *ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0}]", &cb, 1, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open nested: %s", why);
        nested.ds = ds;
        double *got = values(ds, "t2m", &n, &failed, why, sizeof why);
        EXPECT(got && n == n_plain, "the pass itself completes: %s", got ? "" : why);
        EXPECT(atomic_load(&nested.calls) == 3 && atomic_load(&nested.refused) == 3, "calls %d, refused %d",
               atomic_load(&nested.calls), atomic_load(&nested.refused));
        free(got);
        isb_dataset_free(ds);
    }

    /* 4. Bad entries: refused naming the thing, and every callback given is released anyway. */
    {
        State s = {0};
        IsbTransformCallback cbs[2] = {{.apply = scale_offset, .release = release, .user_data = &s},
                                       {.apply = scale_offset, .release = release, .user_data = &s}};
        IsbDataset *ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 2}]", cbs, 2, &st, why, sizeof why);
        EXPECT(!ds && st == ISB_INVALID_ARGUMENT && strstr(why, "[0]") && strstr(why, "2 callback(s)"),
               "out of range: %u %s", (unsigned)st, why);
        EXPECT(atomic_load(&s.released) == 2, "a failed open released %d of 2", atomic_load(&s.released));

        IsbTransformCallback null_apply = {.apply = NULL, .release = release, .user_data = &s};
        ds = open_t2m(store, "[]", &null_apply, 1, &st, why, sizeof why);
        EXPECT(!ds && st == ISB_INVALID_ARGUMENT && strstr(why, "callbacks[0].apply"), "NULL apply: %s", why);
        EXPECT(atomic_load(&s.released) == 3, "NULL apply released: %d", atomic_load(&s.released));

        ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0, \"sahpe\": [9]}]", cbs, 1, &st, why, sizeof why);
        EXPECT(!ds && st == ISB_INVALID_ARGUMENT && strstr(why, "sahpe"), "unknown field: %s", why);
        ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0, \"shape\": [0]}]", cbs, 1, &st, why, sizeof why);
        EXPECT(!ds && st == ISB_INVALID_ARGUMENT && strstr(why, "length 0"), "zero axis: %s", why);
        ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0, \"applies\": [\"t3m\"]}]", cbs, 1, &st, why,
                      sizeof why);
        EXPECT(!ds && st == ISB_INVALID_ARGUMENT && strstr(why, "t3m"), "scope: %s", why);
        EXPECT(atomic_load(&s.released) == 6, "released: %d", atomic_load(&s.released));

        /* A persisted cache needs to know what the function is. */
        char config[2048];
        snprintf(config, sizeof config,
                 "{\"store\": \"%s\", \"cache_dir\": \"%s\", \"persist\": true, "
                 "\"chunk_transforms\": [{\"type\": \"callback\", \"callback\": 0}]}",
                 store, "/tmp/isb-callbacks-never-created");
        IsbError *err = NULL;
        st = isb_dataset_open_with_transforms(config, cbs, 1, &ds, &err);
        EXPECT(st == ISB_INVALID_ARGUMENT && strstr(isb_error_message(err), "identity"), "persist: %s",
               isb_error_message(err));
        isb_error_free(err);
        err = NULL;
        /* isb_dataset_open has no callbacks to refer to. */
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"chunk_transforms\": [{\"type\": \"callback\", \"callback\": 0}]}",
                 store);
        st = isb_dataset_open(config, &ds, &err);
        EXPECT(st == ISB_INVALID_ARGUMENT && strstr(isb_error_message(err), "isb_dataset_open_with_transforms"),
               "plain open: %s", isb_error_message(err));
        isb_error_free(err);
        EXPECT(atomic_load(&s.released) == 7, "released: %d", atomic_load(&s.released));
    }

    /* 5. After isb_callbacks_shutdown no callback runs: a pass needing one fails, naming why,
     * and releases are skipped (the host is tearing down what they need). */
    {
        State s = {.scale = 1.0f};
        IsbTransformCallback cb = {.apply = scale_offset, .release = release, .user_data = &s};
        IsbDataset *ds = open_t2m(store, "[{\"type\": \"callback\", \"callback\": 0}]", &cb, 1, &st, why, sizeof why);
        EXPECT(st == ISB_OK, "open: %s", why);
        EXPECT(isb_callbacks_shutdown(1000, NULL) == ISB_OK, "shutdown with nothing running");
        double *got = values(ds, "t2m", &n, &failed, why, sizeof why);
        EXPECT(!got && failed == ISB_TRANSFORM && strstr(why, "shut down"), "after shutdown: %u %s",
               (unsigned)failed, why);
        EXPECT(atomic_load(&s.calls) == 0, "called %d times after shutdown", atomic_load(&s.calls));
        isb_dataset_free(ds);
        EXPECT(atomic_load(&s.released) == 0, "released after shutdown");
    }

    isb_dataset_free(plain);
    free(raw);
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
