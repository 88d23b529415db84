/* Bad input through the C ABI: every case is a status and a message naming the thing, never a
 * crash. Compiled and run by tests/tests/c_abi.rs; prints "ok" when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "insitubatch.h"

static int failures = 0;

static void expect(const char *what, IsbStatus got, IsbStatus want, IsbError *err, const char *needle) {
    const char *msg = isb_error_message(err);
    if (got != want || (needle && !strstr(msg, needle))) {
        fprintf(stderr, "FAIL %s: status %u (want %u), message: %s\n", what, (unsigned)got, (unsigned)want, msg);
        failures++;
    }
    isb_error_free(err);
}

/* The call runs first and fills `err`; only then is its outcome checked. */
#define CHECK(what, call, want, needle)            \
    do {                                           \
        IsbError *err = NULL;                      \
        IsbStatus got_ = (call);                   \
        expect(what, got_, want, err, needle);     \
    } while (0)

/* A view opened on rows 2..5 and 8 columns: its facts give that sample shape and `region`. */
static void expect_view(const char *what, IsbDataset *ds, const char *region) {
    char *facts = NULL;
    CHECK(what, isb_dataset_stats_json(ds, &facts, &err), ISB_OK, NULL);
    if (!facts || !strstr(facts, "\"sample_shape\":[3,8]") || !strstr(facts, region)) {
        fprintf(stderr, "FAIL %s view: %s\n", what, facts ? facts : "(null)");
        failures++;
    }
    isb_string_free(facts);
}

/* The epoch `prefetch_next_epoch` started early and keeps for `isb_iter_start` (ABI 22), -1 for
   null; -2 when the facts cannot be read. */
static long long prefetched_epoch(const IsbDataset *ds) {
    char *facts = NULL;
    long long epoch = -2;
    if (isb_dataset_stats_json(ds, &facts, NULL) == ISB_OK) {
        const char *at = strstr(facts, "\"prefetched_epoch\":");
        if (at) {
            at += strlen("\"prefetched_epoch\":");
            epoch = strncmp(at, "null", 4) == 0 ? -1 : strtoll(at, NULL, 10);
        }
    }
    isb_string_free(facts);
    return epoch;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const char *store = argv[1];
    IsbDataset *ds = NULL, *ds_rank = NULL;
    char config[4096];

    CHECK("NULL config", isb_dataset_open(NULL, &ds, &err), ISB_NULL_POINTER, "config_json");
    CHECK("NULL out", isb_dataset_open("{}", NULL, &err), ISB_NULL_POINTER, "out");
    CHECK("invalid JSON", isb_dataset_open("{not json", &ds, &err), ISB_INVALID_ARGUMENT, "dataset config");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_sise\": 4}", store);
    CHECK("unknown key", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "batch_sise");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 0}", store);
    CHECK("zero batch_size", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "batch_size");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"max_inflight\": 0}", store);
    CHECK("zero max_inflight", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "max_inflight");
    CHECK("missing store", isb_dataset_open("{\"store\": \"/no/such/store.zarr\"}", &ds, &err), ISB_NOT_FOUND, "/no/such/store.zarr");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [5]}", store);
    CHECK("bad variable entry", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`variables` = 5");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": []}", store);
    CHECK("empty variables", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`variables` = []");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"on_bad_chunk\": \"ignore\"}", store);
    CHECK("bad policy", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "on_bad_chunk");
    /* Object stores: options are for URLs only, checked by key and by value type. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"storage_options\": {\"aws_region\": \"eu-west-1\"}}", store);
    CHECK("storage option for a directory", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "aws_region");
    CHECK("unknown storage option", isb_dataset_open("{\"store\": \"s3://bucket/era5.zarr\", \"storage_options\": {\"aws_no_such\": 1}}", &ds, &err), ISB_INVALID_ARGUMENT, "aws_no_such");
    CHECK("storage option not a scalar", isb_dataset_open("{\"store\": \"s3://bucket/era5.zarr\", \"storage_options\": {\"aws_region\": [1]}}", &ds, &err), ISB_INVALID_ARGUMENT, "storage_options");
    /* Chunk transforms: built-ins by type, checked against the arrays they apply to. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"chunk_transforms\": [{\"type\": \"log\"}]}", store);
    CHECK("unknown transform", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "unknown transform type `log`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"chunk_transforms\": [{\"type\": \"fill_nan\", \"value\": 0, \"applies\": [\"t3m\"]}]}", store);
    CHECK("transform scope names no array", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "t3m");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"chunk_transforms\": [{\"type\": \"affine\", \"offset\": -273.15}]}", store);
    CHECK("a valid transform", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    isb_dataset_free(ds);
    ds = NULL;
    /* fast_first_batch (ABI 10) is a bool. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"fast_first_batch\": 1}", store);
    CHECK("fast_first_batch not a bool", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "fast_first_batch");
    /* Two values of the wrong type: the key named is the one serde's message is about. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"shuffle\": 1, \"block_chunks\": \"x\"}", store);
    CHECK("the first bad value names its key", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`shuffle`: invalid type: integer `1`, expected a boolean");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"fast_first_batch\": true}", store);
    CHECK("fast_first_batch", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    isb_dataset_free(ds);
    ds = NULL;
    /* prefetch_next_epoch (ABI 21): train's next epoch starts while this one decodes its last
       chunks, and is handed over when asked for at that epoch; a budget that holds two
       iterations lets a pass that keeps chunks in the pool start early too. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"prefetch_next_epoch\": \"yes\"}", store);
    CHECK("prefetch_next_epoch not a bool", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "prefetch_next_epoch");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"prefetch_next_epoch\": true, \"batch_size\": 4, \"cache_budget_bytes\": 268435456}", store);
    CHECK("prefetch_next_epoch", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    if (ds && prefetched_epoch(ds) != -1) {
        fprintf(stderr, "FAIL prefetched_epoch before any iteration: %lld\n", prefetched_epoch(ds));
        failures++;
    }
    for (uint64_t epoch = 0; ds && epoch < 3; epoch++) {
        IsbIter *it = NULL;
        IsbBatch *b = NULL;
        char *stats = NULL;
        long rows = 0;
        CHECK("set_epoch", isb_dataset_set_epoch(ds, epoch, &err), ISB_OK, NULL);
        CHECK("train", isb_iter_start(ds, "train", &it, &err), ISB_OK, NULL);
        IsbStatus st = ISB_END_OF_EPOCH;
        while (it && (st = isb_iter_next(it, &b, NULL)) == ISB_OK) {
            DLManagedTensorVersioned *t = NULL;
            if (isb_batch_export(b, "t2m", &t, NULL) == ISB_OK) {
                rows += (long)t->dl_tensor.shape[0];
                t->deleter(t);
            }
            isb_batch_free(b);
        }
        CHECK("epoch ends", st, ISB_END_OF_EPOCH, NULL);
        /* Every chunk is loaded once the last batch is out: the next epoch has been started
           (by a thread of its own; it is waiting to be asked for once that start returns). */
        long long early = -1;
        for (int waited_ms = 0; waited_ms < 10000 && (early = prefetched_epoch(ds)) == -1; waited_ms++) {
            usleep(1000);
        }
        if (early != (long long)epoch + 1) {
            fprintf(stderr, "FAIL prefetched_epoch after epoch %llu: %lld\n", (unsigned long long)epoch, early);
            failures++;
        }
        CHECK("stats", isb_iter_stats_json(it, &stats, &err), ISB_OK, NULL);
        const char *want = epoch > 0 ? "\"started_ahead\":true" : "\"started_ahead\":false";
        if (!stats || !strstr(stats, want) || rows == 0) {
            fprintf(stderr, "FAIL prefetch_next_epoch epoch %llu: %ld rows, %s\n", (unsigned long long)epoch, rows,
                    stats ? stats : "(null)");
            failures++;
        }
        isb_string_free(stats);
        isb_iter_free(it);
    }
    isb_dataset_free(ds);
    ds = NULL;
    /* drop_last with a batch larger than the split: opening works, iterating names it. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 1000, \"drop_last\": true}", store);
    CHECK("drop_last dataset", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    {
        IsbIter *none = NULL;
        CHECK("drop_last leaves no batch", isb_iter_start(ds, "train", &none, &err), ISB_INVALID_ARGUMENT, "drop_last");
        isb_iter_free(none);
    }
    isb_dataset_free(ds);
    ds = NULL;
    /* drop_last for named splits only (ABI 9): a name that is no split, a list of non-strings. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 1000, \"drop_last\": [\"val\"]}", store);
    CHECK("drop_last for val only", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    {
        IsbIter *whole = NULL;
        CHECK("train keeps its short batch", isb_iter_start(ds, "train", &whole, &err), ISB_OK, NULL);
        isb_iter_free(whole);
    }
    isb_dataset_free(ds);
    ds = NULL;
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"drop_last\": [\"training\"]}", store);
    CHECK("drop_last names no split", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "training");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"drop_last\": 1}", store);
    CHECK("drop_last not a bool or list", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "drop_last");
    /* A cropped view: one [start, end) per field axis; only its region is read and held. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[0, 9], [3, 3]]}]}", store);
    CHECK("empty region", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`t2m`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[0, 9]]}]}", store);
    CHECK("region missing an axis", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "per field axis");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"regoin\": [[0, 9], [0, 4]]}]}", store);
    CHECK("misspelt view key", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "regoin");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[2, 5], [4, 12]]}]}", store);
    CHECK("a cropped view", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    expect_view("cropped", ds, "\"region\":[[2,5],[4,12]]");
    isb_dataset_free(ds);
    ds = NULL;
    /* A range across the end of a periodic axis (ABI 9): a negative start with "wrap". */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[2, 5], [-4, 4]]}]}", store);
    CHECK("negative start without wrap", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "\"wrap\": true");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[2, 5], [12, 20]]}]}", store);
    CHECK("past the axis without wrap", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "crop_wrapping");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [{\"label\": \"t\", \"path\": \"t2m\", \"region\": [[2, 5], [-4, 4]], \"wrap\": true}]}", store);
    CHECK("a wrapping view", isb_dataset_open(config, &ds, &err), ISB_OK, NULL);
    expect_view("wrapping", ds, "\"region\":[[2,5],[12,20]]");
    isb_dataset_free(ds);
    ds = NULL;
    CHECK("unreadable scheme", isb_dataset_open("{\"store\": \"ftp://host/era5.zarr\"}", &ds, &err), ISB_INVALID_ARGUMENT, "ftp://");
    char *out = NULL;
    /* Geometries with parameters (ABI 4): options are for URLs, parameters are checked by key. */
    CHECK("geometries, unknown parameter", isb_open_geometries_with(store, "{\"sample_axes\": 0}", &out, &err), ISB_INVALID_ARGUMENT, "sample_axes");
    CHECK("geometries, options for a directory", isb_open_geometries_with(store, "{\"storage_options\": {\"aws_region\": \"x\"}}", &out, &err), ISB_INVALID_ARGUMENT, "aws_region");
    CHECK("geometries, NULL params", isb_open_geometries_with(store, NULL, &out, &err), ISB_NULL_POINTER, "params_json");
    CHECK("geometries with parameters", isb_open_geometries_with(store, "{\"sample_axis\": 0}", &out, &err), ISB_OK, NULL);
    if (!out || !strstr(out, "\"t2m\"")) {
        fprintf(stderr, "FAIL geometries with parameters: %s\n", out ? out : "(null)");
        failures++;
    }
    isb_string_free(out);
    out = NULL;
    /* A region in coordinate values (ABI 13): 67.5N..0, 25W..45E across 0 longitude. */
    CHECK("coordinate region",
          isb_coordinate_region(store, "{\"array\": \"t2m\", \"bounds\": {\"latitude\": [67.5, 0], "
                                "\"longitude\": [-25, 45]}, \"periodic\": {\"longitude\": 360}}", &out, &err),
          ISB_OK, NULL);
    if (!out || strcmp(out, "{\"region\":[[1,5],[15,19]],\"wrap\":true}") != 0) {
        fprintf(stderr, "FAIL coordinate region: %s\n", out ? out : "(null)");
        failures++;
    }
    isb_string_free(out);
    out = NULL;
    CHECK("coordinate region, periodic without bounds",
          isb_coordinate_region(store, "{\"array\": \"t2m\", \"bounds\": {\"latitude\": [0, 9]}, "
                                "\"periodic\": {\"longitude\": 360}}", &out, &err),
          ISB_INVALID_ARGUMENT, "`periodic` names `longitude`");
    CHECK("coordinate region, not a dimension",
          isb_coordinate_region(store, "{\"array\": \"t2m\", \"bounds\": {\"level\": [0, 9]}}", &out, &err),
          ISB_INVALID_ARGUMENT, "`level` is not a dimension");
    /* Coordinate values (ABI 14): the sample axis's time, read across its partial last chunk. */
    CHECK("coordinate values", isb_coordinate_values(store, "{\"array\": \"t2m\"}", &out, &err), ISB_OK, NULL);
    if (!out || !strstr(out, "\"values\":[0,6,12,18,24,30,36,42,48,54,60,66]") ||
        !strstr(out, "\"dimension\":\"time\"") || !strstr(out, "\"dtype\":\"int64\"")) {
        fprintf(stderr, "FAIL coordinate values: %s\n", out ? out : "(null)");
        failures++;
    }
    isb_string_free(out);
    out = NULL;
    CHECK("coordinate values, not a dimension",
          isb_coordinate_values(store, "{\"array\": \"t2m\", \"dimension\": \"level\"}", &out, &err),
          ISB_INVALID_ARGUMENT, "`level` is not a dimension");
    CHECK("coordinate values, unknown parameter",
          isb_coordinate_values(store, "{\"array\": \"t2m\", \"dim\": \"time\"}", &out, &err),
          ISB_INVALID_ARGUMENT, "dim");
    CHECK("coordinate region, no array", isb_coordinate_region(store, "{\"bounds\": {}}", &out, &err),
          ISB_INVALID_ARGUMENT, "array");
    /* Stores mounted as groups (ABI 16): the store mounted in itself as `again` reads
     * `again/t2m` from the same bytes as `t2m`; a bad mount is refused naming it. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": [\"%s\"]}", store, store);
    CHECK("mounts not an object", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`mounts`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"again\": {\"path\": \"%s\"}}}", store, store);
    CHECK("mount entry without store", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`mounts`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"t2m\": \"%s\"}}", store, store);
    CHECK("mount hiding an array", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "already has an array `t2m`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"x\": \"/no/such/mount.zarr\"}}", store);
    CHECK("missing mount", isb_dataset_open(config, &ds, &err), ISB_NOT_FOUND, "/no/such/mount.zarr");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"x\": {\"store\": \"%s\", \"storage_options\": {\"aws_region\": \"eu\"}}}}", store, store);
    CHECK("storage options for a local mount", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "aws_region");
    {
        IsbDataset *mounted = NULL;
        snprintf(config, sizeof config,
                 "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\"}}, \"batch_size\": 4, "
                 "\"variables\": [\"t2m\", {\"label\": \"t\", \"path\": \"again/t2m\"}]}",
                 store, store);
        CHECK("open mounted", isb_dataset_open(config, &mounted, &err), ISB_OK, NULL);
        IsbIter *it_m = NULL;
        IsbBatch *bm = NULL;
        DLManagedTensorVersioned *own = NULL, *via = NULL;
        if (!mounted || isb_iter_start(mounted, "all", &it_m, NULL) != ISB_OK || isb_iter_next(it_m, &bm, NULL) != ISB_OK ||
            isb_batch_export(bm, "t2m", &own, NULL) != ISB_OK || isb_batch_export(bm, "t", &via, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL a batch of a dataset with a mount\n");
            return 1;
        }
        size_t bytes = 4 * 9 * 16 * sizeof(float);
        if (own->dl_tensor.shape[0] != 4 || memcmp(own->dl_tensor.data, via->dl_tensor.data, bytes) != 0) {
            fprintf(stderr, "FAIL a mounted array's rows differ from the same array's own\n");
            failures++;
        }
        own->deleter(own);
        via->deleter(via);
        isb_batch_free(bm);
        isb_iter_free(it_m);
        isb_dataset_free(mounted);
    }
    /* An aligned mount (ABI 17): the store mounted in itself starting at the root's sample 3
     * reads `again/station` three samples behind `station` (whose values are their indices),
     * over the 9 anchors both cover; aligned on `time` it reads the same samples. The nearest
     * sample (ABI 18) is found on CF times only, which this store's `time` is not. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": true}}}", store, store);
    CHECK("align neither a name nor an integer", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`align` (ABI 17)");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": {\"containing\": 3}}}}", store, store);
    CHECK("containing not a name", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "{\"containing\": \"time\"}");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": {\"nearer\": \"time\"}}}}", store, store);
    CHECK("an unknown way to align", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "{\"nearest\": \"time\"} (ABI 18");
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": \"level\"}}, "
             "\"variables\": [\"station\", {\"label\": \"s\", \"path\": \"again/station\"}]}",
             store, store);
    CHECK("align on a missing coordinate", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "cannot align on `level`");
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": {\"nearest\": \"time\"}}}, "
             "\"variables\": [\"station\", {\"label\": \"s\", \"path\": \"again/station\"}]}",
             store, store);
    CHECK("nearest on a time that is not CF", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "nearest alignment reads only on CF times");
    const char *alignments[] = {"3", "\"time\""};
    for (int k = 0; k < 2; k++) {
        IsbDataset *aligned = NULL;
        snprintf(config, sizeof config,
                 "{\"store\": \"%s\", \"mounts\": {\"again\": {\"store\": \"%s\", \"align\": %s}}, "
                 "\"shuffle\": false, \"batch_size\": 12, "
                 "\"variables\": [\"station\", {\"label\": \"s\", \"path\": \"again/station\"}]}",
                 store, store, alignments[k]);
        CHECK("open aligned", isb_dataset_open(config, &aligned, &err), ISB_OK, NULL);
        int behind = k == 0 ? 3 : 0;
        char *facts = NULL, want_range[64], want_alignment[64];
        snprintf(want_range, sizeof want_range, "\"anchor_range\":[%d,12]", behind);
        snprintf(want_alignment, sizeof want_alignment, "\"placement\":{\"mul\":1,\"add\":%d,\"div\":1,\"containing\":false}", -behind);
        CHECK("aligned facts", isb_dataset_stats_json(aligned, &facts, &err), ISB_OK, NULL);
        if (!facts || !strstr(facts, want_range) || !strstr(facts, want_alignment)) {
            fprintf(stderr, "FAIL aligned facts (%s, %s): %s\n", want_range, want_alignment, facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        IsbIter *ia = NULL;
        IsbBatch *ba = NULL;
        DLManagedTensorVersioned *own = NULL, *via = NULL;
        if (!aligned || isb_iter_start(aligned, "all", &ia, NULL) != ISB_OK || isb_iter_next(ia, &ba, NULL) != ISB_OK ||
            isb_batch_export(ba, "station", &own, NULL) != ISB_OK || isb_batch_export(ba, "s", &via, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL a batch of an aligned mount\n");
            return 1;
        }
        if (own->dl_tensor.shape[0] != 12 - behind) {
            fprintf(stderr, "FAIL aligned by %d: %lld rows, not %d\n", behind, (long long)own->dl_tensor.shape[0], 12 - behind);
            failures++;
        } else {
            const float *a = own->dl_tensor.data, *b = via->dl_tensor.data;
            for (int r = 0; r < 12 - behind; r++) {
                if (a[r] != (float)(r + behind) || b[r] != (float)r) {
                    fprintf(stderr, "FAIL aligned by %d, row %d: station %g, again/station %g\n", behind, r, a[r], b[r]);
                    failures++;
                }
            }
        }
        own->deleter(own);
        via->deleter(via);
        isb_batch_free(ba);
        isb_iter_free(ia);
        isb_dataset_free(aligned);
    }
    /* An indexed view (ABI 17): `back` reads `station` (values = indices) at 11 - anchor. */
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"station\", {\"label\": \"back\", \"path\": \"station\", \"index\": [0, 1]}]}",
             store);
    CHECK("an index of another length", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`indexes` = back");
    {
        IsbDataset *indexed = NULL;
        snprintf(config, sizeof config,
                 "{\"store\": \"%s\", \"shuffle\": false, \"batch_size\": 12, \"variables\": [\"station\", "
                 "{\"label\": \"back\", \"path\": \"station\", \"index\": [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0]}]}",
                 store);
        CHECK("open indexed", isb_dataset_open(config, &indexed, &err), ISB_OK, NULL);
        char *facts = NULL;
        CHECK("indexed facts", isb_dataset_stats_json(indexed, &facts, &err), ISB_OK, NULL);
        if (!facts || !strstr(facts, "\"label\":\"back\"") || !strstr(facts, "\"indexed\":true")) {
            fprintf(stderr, "FAIL an indexed view in the facts: %s\n", facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        IsbIter *ii = NULL;
        IsbBatch *bi = NULL;
        DLManagedTensorVersioned *back = NULL;
        if (!indexed || isb_iter_start(indexed, "all", &ii, NULL) != ISB_OK || isb_iter_next(ii, &bi, NULL) != ISB_OK ||
            isb_batch_export(bi, "back", &back, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL a batch with an indexed view\n");
            return 1;
        }
        const float *rows = back->dl_tensor.data;
        for (int r = 0; r < 12; r++) {
            if (back->dl_tensor.shape[0] != 12 || rows[r] != (float)(11 - r)) {
                fprintf(stderr, "FAIL indexed row %d: %g, not %d\n", r, rows[r], 11 - r);
                failures++;
                break;
            }
        }
        back->deleter(back);
        isb_batch_free(bi);
        isb_iter_free(ii);
        isb_dataset_free(indexed);
    }
    /* A static field (ABI 16): the 12-element `station` array whole in every row beside t2m;
     * a static view with an offset is refused naming it. */
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"t2m\", {\"label\": \"s\", \"path\": \"station\", \"static\": true, \"offset\": 1}]}",
             store);
    CHECK("static with an offset", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "no sample axis to shift along");
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [{\"label\": \"s\", \"path\": \"station\", \"static\": true}]}", store);
    CHECK("only a static field", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "every variable is a static field");
    {
        IsbDataset *with_static = NULL, *plain = NULL;
        snprintf(config, sizeof config,
                 "{\"store\": \"%s\", \"batch_size\": 5, \"variables\": [\"t2m\", {\"label\": \"s\", \"path\": \"station\", \"static\": true}]}",
                 store);
        CHECK("open with a static field", isb_dataset_open(config, &with_static, &err), ISB_OK, NULL);
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"shuffle\": false, \"batch_size\": 12, \"variables\": [\"station\"]}", store);
        CHECK("open station sampled", isb_dataset_open(config, &plain, &err), ISB_OK, NULL);
        char *facts = NULL;
        CHECK("static facts", isb_dataset_stats_json(with_static, &facts, &err), ISB_OK, NULL);
        if (!facts || !strstr(facts, "\"static\":true") || !strstr(facts, "\"shape\":[12]")) {
            fprintf(stderr, "FAIL a static field in the facts: %s\n", facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        IsbIter *is = NULL, *ip = NULL;
        IsbBatch *bs = NULL, *bp = NULL;
        DLManagedTensorVersioned *st = NULL, *whole = NULL;
        if (!with_static || !plain || isb_iter_start(with_static, "train", &is, NULL) != ISB_OK ||
            isb_iter_next(is, &bs, NULL) != ISB_OK || isb_batch_export(bs, "s", &st, NULL) != ISB_OK ||
            isb_iter_start(plain, "all", &ip, NULL) != ISB_OK || isb_iter_next(ip, &bp, NULL) != ISB_OK ||
            isb_batch_export(bp, "station", &whole, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL a batch with a static field\n");
            return 1;
        }
        /* Every row of `s` is the whole station array, as the sequential pass reads it. */
        if (st->dl_tensor.ndim != 2 || st->dl_tensor.shape[0] != 5 || st->dl_tensor.shape[1] != 12 ||
            whole->dl_tensor.shape[0] != 12) {
            fprintf(stderr, "FAIL static field shape\n");
            failures++;
        } else {
            for (int r = 0; r < 5; r++) {
                if (memcmp((const float *)st->dl_tensor.data + 12 * r, whole->dl_tensor.data, 12 * sizeof(float)) != 0) {
                    fprintf(stderr, "FAIL static row %d differs from the array\n", r);
                    failures++;
                    break;
                }
            }
        }
        st->deleter(st);
        whole->deleter(whole);
        isb_batch_free(bs);
        isb_batch_free(bp);
        isb_iter_free(is);
        isb_iter_free(ip);
        isb_dataset_free(with_static);
        isb_dataset_free(plain);
    }
    /* Labels stacked as channels (ABI 14): one array (batch, 2, *field), each channel the
     * label's own array; a bad stack is refused naming `stacks`. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"stacks\": [\"t2m\"]}", store);
    CHECK("stacks not an object", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`stacks`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"stacks\": {\"x\": [\"t2m\", \"station\"]}}", store);
    CHECK("stack of unequal samples", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "one sample shape");
    {
        IsbDataset *own = NULL, *stacked = NULL;
        const char *vars = "\"variables\": [\"t2m\", \"u10\", \"station\"], \"batch_size\": 5";
        snprintf(config, sizeof config, "{\"store\": \"%s\", %s}", store, vars);
        CHECK("open unstacked", isb_dataset_open(config, &own, &err), ISB_OK, NULL);
        snprintf(config, sizeof config, "{\"store\": \"%s\", %s, \"stacks\": {\"x\": [\"u10\", \"t2m\"]}}", store, vars);
        CHECK("open stacked", isb_dataset_open(config, &stacked, &err), ISB_OK, NULL);
        char *facts = NULL;
        CHECK("stacked facts", isb_dataset_stats_json(stacked, &facts, &err), ISB_OK, NULL);
        if (!facts || !strstr(facts, "\"arrays\":[{") || !strstr(facts, "\"name\":\"x\"") ||
            !strstr(facts, "\"labels\":[\"u10\",\"t2m\"]") || !strstr(facts, "\"shape\":[2,9,16]") ||
            !strstr(facts, "\"stacked\":true")) {
            fprintf(stderr, "FAIL stacked arrays in the facts: %s\n", facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        IsbIter *io = NULL, *is = NULL;
        IsbBatch *bo = NULL, *bs = NULL;
        if (!own || !stacked || isb_iter_start(own, "train", &io, NULL) != ISB_OK ||
            isb_iter_start(stacked, "train", &is, NULL) != ISB_OK || isb_iter_next(io, &bo, NULL) != ISB_OK ||
            isb_iter_next(is, &bs, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL a batch of the stacked and unstacked datasets\n");
            return 1;
        }
        size_t n_arrays = 0;
        const char *name0 = NULL, *name1 = NULL;
        isb_batch_label_count(bs, &n_arrays, NULL);
        isb_batch_label(bs, 0, &name0, NULL);
        isb_batch_label(bs, 1, &name1, NULL);
        if (n_arrays != 2 || strcmp(name0, "x") != 0 || strcmp(name1, "station") != 0) {
            fprintf(stderr, "FAIL stacked batch arrays: %zu, %s, %s\n", n_arrays, name0, name1);
            failures++;
        }
        DLManagedTensorVersioned *x = NULL, *u = NULL, *t = NULL, *gone = NULL;
        CHECK("a stacked label has no array", isb_batch_export(bs, "t2m", &gone, &err), ISB_INVALID_ARGUMENT, "no array `t2m`");
        CHECK("export stack", isb_batch_export(bs, "x", &x, &err), ISB_OK, NULL);
        CHECK("export u10", isb_batch_export(bo, "u10", &u, &err), ISB_OK, NULL);
        CHECK("export t2m", isb_batch_export(bo, "t2m", &t, &err), ISB_OK, NULL);
        if (x && u && t) {
            const int64_t *sh = x->dl_tensor.shape;
            size_t field = 9 * 16, rows = (size_t)sh[0];
            if (x->dl_tensor.ndim != 4 || sh[1] != 2 || sh[2] != 9 || sh[3] != 16 || rows != (size_t)u->dl_tensor.shape[0]) {
                fprintf(stderr, "FAIL stacked tensor shape\n");
                failures++;
            } else {
                const float *xs = x->dl_tensor.data, *us = u->dl_tensor.data, *ts = t->dl_tensor.data;
                for (size_t r = 0; r < rows; r++) {
                    if (memcmp(xs + (2 * r) * field, us + r * field, field * sizeof(float)) != 0 ||
                        memcmp(xs + (2 * r + 1) * field, ts + r * field, field * sizeof(float)) != 0) {
                        fprintf(stderr, "FAIL stacked row %zu differs from the labels' own arrays\n", r);
                        failures++;
                        break;
                    }
                }
            }
        }
        if (x) x->deleter(x);
        if (u) u->deleter(u);
        if (t) t->deleter(t);
        /* Statistics (ABI 15): per channel of the stack; a batch of another dataset is refused. */
        IsbStatistics *st = NULL;
        CHECK("statistics past the axes", isb_statistics_new(stacked, "{\"axis\": 3}", &st, &err), ISB_INVALID_ARGUMENT, "`axis`");
        CHECK("a quantile past 1", isb_statistics_new(stacked, "{\"quantiles\": [0.5, 2]}", &st, &err), ISB_INVALID_ARGUMENT, "`quantiles`");
        CHECK("statistics per channel", isb_statistics_new(stacked, "{\"axis\": 0}", &st, &err), ISB_OK, NULL);
        /* Quantiles (ABI 23): the probabilities and one value per index and probability. */
        IsbStatistics *sq = NULL;
        CHECK("statistics with quantiles", isb_statistics_new(stacked, "{\"axis\": 0, \"quantiles\": [0, 0.5, 1]}", &sq, &err), ISB_OK, NULL);
        CHECK("a batch of another dataset", isb_statistics_add(st, bo, &err), ISB_INVALID_ARGUMENT, "`batch`");
        CHECK("add a stacked batch", isb_statistics_add(st, bs, &err), ISB_OK, NULL);
        CHECK("add a stacked batch to the quantiles", isb_statistics_add(sq, bs, &err), ISB_OK, NULL);
        char *qj = NULL;
        CHECK("quantiles JSON", isb_statistics_json(sq, &qj, &err), ISB_OK, NULL);
        if (!qj || !strstr(qj, "\"quantiles\":[0.0,0.5,1.0]") || !strstr(qj, "\"quantile_values\":[[")) {
            fprintf(stderr, "FAIL quantiles JSON: %s\n", qj ? qj : "(null)");
            failures++;
        }
        isb_string_free(qj);
        isb_statistics_free(sq);
        CHECK("NULL stats", isb_statistics_add(NULL, bs, &err), ISB_NULL_POINTER, "stats");
        char *sj = NULL;
        CHECK("statistics JSON", isb_statistics_json(st, &sj, &err), ISB_OK, NULL);
        size_t rows_added = 0;
        isb_batch_len(bs, &rows_added, NULL);
        char want_count[64];
        snprintf(want_count, sizeof want_count, "\"count\":[%zu,%zu]", rows_added * 9 * 16, rows_added * 9 * 16);
        if (!sj || !strstr(sj, "\"x\":{\"axis\":0") || !strstr(sj, want_count)) {
            fprintf(stderr, "FAIL statistics JSON (want %s): %s\n", want_count, sj ? sj : "(null)");
            failures++;
        }
        isb_string_free(sj);
        isb_statistics_free(st);
        isb_statistics_free(NULL);
        isb_batch_free(bo);
        isb_batch_free(bs);
        isb_iter_free(io);
        isb_iter_free(is);
        isb_dataset_free(own);
        isb_dataset_free(stacked);
        ds = NULL;
    }
    /* A patch (ABI 19): 4 x 5 windows of t2m's 9 x 16 field, each the whole field's values at
     * the row's origin; the facts give the patch and the arrays' patched shape; a patch larger
     * than the field is refused naming `patch`. */
    {
        IsbDataset *whole = NULL, *patched = NULL;
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"shuffle\": false, \"batch_size\": 5, \"patch\": [10, 5]}", store);
        CHECK("a patch larger than the field", isb_dataset_open(config, &patched, &err), ISB_INVALID_ARGUMENT, "`patch`");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [4, 5], \"wrap\": true}}", store);
        CHECK("a patch's wrap not a list", isb_dataset_open(config, &patched, &err), ISB_INVALID_ARGUMENT, "\"wrap\": [false, true]");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [4, 5], \"wrap\": [false, true]}}", store);
        CHECK("a periodic patch", isb_dataset_open(config, &patched, &err), ISB_OK, NULL);
        char *wrapped = NULL;
        CHECK("periodic patch facts", isb_dataset_stats_json(patched, &wrapped, &err), ISB_OK, NULL);
        if (!wrapped || !strstr(wrapped, "\"patch_wrap\":[false,true]")) {
            fprintf(stderr, "FAIL periodic patch in the facts: %s\n", wrapped ? wrapped : "(null)");
            failures++;
        }
        isb_string_free(wrapped);
        isb_dataset_free(patched);
        patched = NULL;
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"shuffle\": false, \"batch_size\": 5, \"patch\": [4, 5]}", store);
        CHECK("open patched", isb_dataset_open(config, &patched, &err), ISB_OK, NULL);
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"shuffle\": false, \"batch_size\": 5}", store);
        CHECK("open whole", isb_dataset_open(config, &whole, &err), ISB_OK, NULL);
        char *facts = NULL;
        CHECK("patched facts", isb_dataset_stats_json(patched, &facts, &err), ISB_OK, NULL);
        if (!facts || !strstr(facts, "\"patch\":[4,5]") || !strstr(facts, "\"shape\":[4,5]") ||
            !strstr(facts, "\"patch_wrap\":[false,false]")) {
            fprintf(stderr, "FAIL patch in the facts: %s\n", facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        IsbIter *ip = NULL, *iw = NULL;
        IsbBatch *bp = NULL, *bw = NULL;
        if (!patched || !whole || isb_iter_start(patched, "all", &ip, NULL) != ISB_OK ||
            isb_iter_start(whole, "all", &iw, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL iterations of the patched and whole datasets\n");
            return 1;
        }
        size_t rows_seen = 0;
        while (isb_iter_next(ip, &bp, NULL) == ISB_OK) {
            const uint64_t *origins = NULL;
            size_t n_origins = 0, rows = 0;
            DLManagedTensorVersioned *p = NULL, *w = NULL;
            if (isb_iter_next(iw, &bw, NULL) != ISB_OK || isb_batch_len(bp, &rows, NULL) != ISB_OK ||
                isb_batch_patch_origins(bp, &origins, &n_origins, NULL) != ISB_OK || n_origins != 2 * rows ||
                isb_batch_export(bp, "t2m", &p, NULL) != ISB_OK || isb_batch_export(bw, "t2m", &w, NULL) != ISB_OK ||
                p->dl_tensor.ndim != 3 || p->dl_tensor.shape[1] != 4 || p->dl_tensor.shape[2] != 5) {
                fprintf(stderr, "FAIL a patched batch: %zu origins for %zu rows\n", n_origins, rows);
                failures++;
                break;
            }
            const float *ps = p->dl_tensor.data, *ws = w->dl_tensor.data;
            for (size_t r = 0; r < rows; r++) {
                uint64_t i0 = origins[2 * r], j0 = origins[2 * r + 1];
                if (i0 > 9 - 4 || j0 > 16 - 5) {
                    fprintf(stderr, "FAIL origin (%llu, %llu) past the field\n", (unsigned long long)i0, (unsigned long long)j0);
                    failures++;
                    break;
                }
                for (size_t i = 0; i < 4; i++)
                    if (memcmp(ps + (r * 4 + i) * 5, ws + r * 9 * 16 + (i0 + i) * 16 + j0, 5 * sizeof(float)) != 0) {
                        fprintf(stderr, "FAIL row %zu of the patch at (%llu, %llu) differs from the field\n", r,
                                (unsigned long long)i0, (unsigned long long)j0);
                        failures++;
                        r = rows;
                        break;
                    }
            }
            rows_seen += rows;
            p->deleter(p);
            w->deleter(w);
            isb_batch_free(bp);
            isb_batch_free(bw);
        }
        if (rows_seen != 12) {
            fprintf(stderr, "FAIL the patched epoch gave %zu rows, want 12\n", rows_seen);
            failures++;
        }
        isb_iter_free(iw);
        iw = NULL;
        /* Without a patch: no origins. */
        const uint64_t *none = (const uint64_t *)1;
        size_t n_none = 9;
        if (isb_iter_start(whole, "all", &iw, NULL) == ISB_OK && isb_iter_next(iw, &bw, NULL) == ISB_OK) {
            CHECK("no patch origins", isb_batch_patch_origins(bw, &none, &n_none, &err), ISB_OK, NULL);
            if (none != NULL || n_none != 0) {
                fprintf(stderr, "FAIL a batch without a patch has %zu origins\n", n_none);
                failures++;
            }
            CHECK("patch origins, NULL len", isb_batch_patch_origins(bw, &none, NULL, &err), ISB_NULL_POINTER, "`len`");
            isb_batch_free(bw);
        }
        CHECK("patch origins, NULL batch", isb_batch_patch_origins(NULL, &none, &n_none, &err), ISB_NULL_POINTER, "`b`");
        isb_iter_free(ip);
        isb_iter_free(iw);
        isb_dataset_free(patched);
        isb_dataset_free(whole);
    }
    /* Patches placed (ABI 20): a grid of 3 x 4 tiles over t2m's 9 x 16 field, twelve rows per
     * sample, stitched back into each whole field; bad placements name their argument. */
    {
        IsbDataset *tiled = NULL, *whole = NULL;
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [3, 4], \"per_sample\": 0}}", store);
        CHECK("no patch per sample", isb_dataset_open(config, &tiled, &err), ISB_INVALID_ARGUMENT, "`patches_per_sample`");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [3, 4], \"grid\": [4, 4]}}", store);
        CHECK("a grid stride past the patch", isb_dataset_open(config, &tiled, &err), ISB_INVALID_ARGUMENT, "`patch_grid`");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [3, 4], \"grid\": \"yes\"}}", store);
        CHECK("a grid neither a flag nor a stride", isb_dataset_open(config, &tiled, &err), ISB_INVALID_ARGUMENT, "\"grid\": true");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"patch\": {\"shape\": [3, 4], \"grid\": true, \"per_sample\": 2}}", store);
        CHECK("drawn and tiled patches at once", isb_dataset_open(config, &tiled, &err), ISB_INVALID_ARGUMENT, "give one");
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"batch_size\": 12}", store);
        CHECK("open whole fields", isb_dataset_open(config, &whole, &err), ISB_OK, NULL);
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"batch_size\": 10, \"patch\": {\"shape\": [3, 4], \"grid\": true}}", store);
        CHECK("open a grid", isb_dataset_open(config, &tiled, &err), ISB_OK, NULL);
        char *facts = NULL;
        uint64_t n = 0;
        CHECK("grid facts", isb_dataset_stats_json(tiled, &facts, &err), ISB_OK, NULL);
        CHECK("grid length", isb_dataset_split_len(tiled, "train", &n, NULL, &err), ISB_OK, NULL);
        if (n != 12 * 12 || !facts || !strstr(facts, "\"patches_per_sample\":12") || !strstr(facts, "\"patch_grid\":[3,4]")) {
            fprintf(stderr, "FAIL grid: %llu rows (want 144), facts %s\n", (unsigned long long)n, facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        /* The whole fields, in sample order (one batch of the unshuffled `all`). */
        static float fields[12 * 9 * 16], stitched[12 * 9 * 16];
        IsbIter *it = NULL;
        IsbBatch *b = NULL;
        DLManagedTensorVersioned *t = NULL;
        if (isb_iter_start(whole, "all", &it, NULL) != ISB_OK || isb_iter_next(it, &b, NULL) != ISB_OK ||
            isb_batch_export(b, "t2m", &t, NULL) != ISB_OK) {
            fprintf(stderr, "FAIL reading the whole fields\n");
            return 1;
        }
        memcpy(fields, t->dl_tensor.data, sizeof fields);
        t->deleter(t);
        isb_batch_free(b);
        isb_iter_free(it);
        for (size_t i = 0; i < 12 * 9 * 16; i++) stitched[i] = -1.0f;
        size_t rows_seen = 0;
        CHECK("iterate the grid", isb_iter_start(tiled, "train", &it, &err), ISB_OK, NULL);
        while (it && isb_iter_next(it, &b, NULL) == ISB_OK) {
            const uint64_t *origins = NULL, *samples = NULL;
            size_t n_origins = 0, n_samples = 0;
            if (isb_batch_patch_origins(b, &origins, &n_origins, NULL) != ISB_OK ||
                isb_batch_sample_indices(b, &samples, &n_samples, NULL) != ISB_OK || n_origins != 2 * n_samples ||
                isb_batch_export(b, "t2m", &t, NULL) != ISB_OK) {
                fprintf(stderr, "FAIL a batch of the grid\n");
                failures++;
                break;
            }
            const float *v = t->dl_tensor.data;
            for (size_t r = 0; r < n_samples; r++)
                for (size_t i = 0; i < 3; i++)
                    for (size_t j = 0; j < 4; j++)
                        stitched[samples[r] * 144 + (origins[2 * r] + i) * 16 + origins[2 * r + 1] + j] = v[(r * 3 + i) * 4 + j];
            rows_seen += n_samples;
            t->deleter(t);
            isb_batch_free(b);
        }
        isb_iter_free(it);
        if (rows_seen != 144 || memcmp(fields, stitched, sizeof fields) != 0) {
            fprintf(stderr, "FAIL the grid's %zu rows do not stitch back into the fields\n", rows_seen);
            failures++;
        }
        isb_dataset_free(tiled);
        isb_dataset_free(whole);
    }
    CHECK("split, options for a directory", isb_split_by_chunk(store, NULL, "{\"fractions\": [1.0], \"storage_options\": {\"aws_region\": \"x\"}}", &out, &err), ISB_INVALID_ARGUMENT, "aws_region");
    CHECK("bad fractions", isb_split_by_chunk(store, NULL, "{\"fractions\": [0.9, 0.3]}", &out, &err), ISB_INVALID_ARGUMENT, "fractions");
    /* A sample stride (ABI 15): t2m's 12 samples, every 5th from 1 (1, 6, 11). */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"sample_stride\": 5, \"sample_phase\": 5}", store);
    CHECK("a phase not below the stride", isb_dataset_open(config, &ds, &err), ISB_INVALID_ARGUMENT, "`sample_phase`");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"sample_stride\": 5, \"sample_phase\": 1}", store);
    {
        IsbDataset *strided = NULL;
        uint64_t n = 0;
        char *facts = NULL;
        CHECK("open with a stride", isb_dataset_open(config, &strided, &err), ISB_OK, NULL);
        CHECK("strided length", isb_dataset_split_len(strided, "train", &n, NULL, &err), ISB_OK, NULL);
        CHECK("strided facts", isb_dataset_stats_json(strided, &facts, &err), ISB_OK, NULL);
        if (n != 3 || !facts || !strstr(facts, "\"sample_stride\":5") || !strstr(facts, "\"sample_phase\":1")) {
            fprintf(stderr, "FAIL strided: %llu samples (want 3), facts %s\n", (unsigned long long)n, facts ? facts : "(null)");
            failures++;
        }
        isb_string_free(facts);
        isb_dataset_free(strided);
    }
    /* Splits by ranges (ABI 15): t2m's 12 samples in chunks of 4; train 0..8 and test 8..12. */
    char *ranged = NULL;
    CHECK("split by ranges", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [0, 8], \"test\": [8, 12]}}", &ranged, &err), ISB_OK, NULL);
    if (ranged) {
        IsbDataset *by_range = NULL;
        uint64_t n[2] = {0, 0};
        snprintf(config, sizeof config, "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"manifest\": %s}", store, ranged);
        CHECK("open over ranges", isb_dataset_open(config, &by_range, &err), ISB_OK, NULL);
        CHECK("ranged train length", isb_dataset_split_len(by_range, "train", &n[0], NULL, &err), ISB_OK, NULL);
        CHECK("ranged test length", isb_dataset_split_len(by_range, "test", &n[1], NULL, &err), ISB_OK, NULL);
        if (n[0] != 8 || n[1] != 4) {
            fprintf(stderr, "FAIL ranged lengths: train %llu, test %llu (want 8, 4)\n", (unsigned long long)n[0], (unsigned long long)n[1]);
            failures++;
        }
        CHECK("a split given no range", isb_dataset_split_len(by_range, "val", &n[0], NULL, &err), ISB_INVALID_ARGUMENT, "give `val` a range");
        isb_dataset_free(by_range);
        isb_string_free(ranged);
    }
    CHECK("a bound inside a chunk", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [0, 6]}}", &out, &err), ISB_INVALID_ARGUMENT, "sample 6 falls inside chunk 1 (samples 4..8)");
    CHECK("snap inward", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [0, 6]}, \"snap\": \"inward\"}", &out, &err), ISB_OK, NULL);
    isb_string_free(out);
    out = NULL;
    CHECK("bad snap", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [0, 8]}, \"snap\": \"sideways\"}", &out, &err), ISB_INVALID_ARGUMENT, "`snap`");
    CHECK("a date on a time without units", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [\"1979-01-01\", 8]}}", &out, &err), ISB_INVALID_ARGUMENT, "give sample indices");
    CHECK("a negative bound", isb_split_by_chunk(store, "t2m", "{\"ranges\": {\"train\": [0, -4]}}", &out, &err), ISB_INVALID_ARGUMENT, "[start, stop]");
    CHECK("ranges and fractions", isb_split_by_chunk(store, "t2m", "{\"fractions\": [1.0], \"ranges\": {\"train\": [0, 8]}}", &out, &err), ISB_INVALID_ARGUMENT, "`ranges` replaces `fractions`");
    CHECK("neither", isb_split_by_chunk(store, "t2m", "{\"seed\": 1}", &out, &err), ISB_INVALID_ARGUMENT, "give `fractions`");

    IsbError *err = NULL;
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 5}", store);
    if (isb_dataset_open(config, &ds, &err) != ISB_OK) {
        fprintf(stderr, "open: %s\n", isb_error_message(err));
        return 1;
    }
    /* Fork after open: the child gets ISB_WRONG_PROCESS (no hang), the parent keeps working. */
    pid_t pid = fork();
    if (pid == 0) {
        IsbIter *child_it = NULL;
        IsbError *child_err = NULL;
        IsbStatus s = isb_iter_start(ds, "train", &child_it, &child_err);
        int good = s == ISB_WRONG_PROCESS && strstr(isb_error_message(child_err), "fork") != NULL;
        isb_error_free(child_err);
        isb_dataset_free(ds); /* allowed in the child; touches no runtime */
        _exit(good ? 0 : 1);
    }
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "FAIL fork: the child did not get ISB_WRONG_PROCESS\n");
        failures++;
    }
    /* Data-parallel ranks: 3 chunks of 4 samples, rank 0 of 2 reads chunk 0, rank 1 chunks 1 and
     * 2 (8 samples); train is evened out to 4 samples on both. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"rank\": 2, \"world_size\": 2}", store);
    CHECK("rank past world_size", isb_dataset_open(config, &ds_rank, &err), ISB_INVALID_ARGUMENT, "`rank` = 2");
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 3, \"rank\": 1, \"world_size\": 2}", store);
    CHECK("open rank 1 of 2", isb_dataset_open(config, &ds_rank, &err), ISB_OK, NULL);
    uint64_t rank_len[4] = {0};
    CHECK("rank train length", isb_dataset_split_len(ds_rank, "train", &rank_len[0], &rank_len[1], &err), ISB_OK, NULL);
    CHECK("rank all length", isb_dataset_split_len(ds_rank, "all", &rank_len[2], &rank_len[3], &err), ISB_OK, NULL);
    if (rank_len[0] != 4 || rank_len[1] != 2 || rank_len[2] != 8 || rank_len[3] != 3) {
        fprintf(stderr, "FAIL rank lengths: train %llu in %llu, all %llu in %llu; want 4 in 2, 8 in 3\n",
                (unsigned long long)rank_len[0], (unsigned long long)rank_len[1],
                (unsigned long long)rank_len[2], (unsigned long long)rank_len[3]);
        failures++;
    }
    isb_dataset_free(ds_rank);
    /* even_train false: rank 1's whole share, 8 samples. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 3, \"rank\": 1, \"world_size\": 2, \"even_train\": false}", store);
    CHECK("open rank 1 of 2, whole share", isb_dataset_open(config, &ds_rank, &err), ISB_OK, NULL);
    CHECK("whole share length", isb_dataset_split_len(ds_rank, "train", &rank_len[0], NULL, &err), ISB_OK, NULL);
    if (rank_len[0] != 8) {
        fprintf(stderr, "FAIL whole share: train %llu samples, want 8\n", (unsigned long long)rank_len[0]);
        failures++;
    }
    isb_dataset_free(ds_rank);
    /* An epoch's length before it runs: 12 samples in batches of 5. */
    uint64_t samples = 0, batches = 0;
    CHECK("split length", isb_dataset_split_len(ds, "train", &samples, &batches, &err), ISB_OK, NULL);
    if (samples != 12 || batches != 3) {
        fprintf(stderr, "FAIL split length: %llu samples in %llu batches, want 12 in 3\n",
                (unsigned long long)samples, (unsigned long long)batches);
        failures++;
    }
    CHECK("split length, NULL outs", isb_dataset_split_len(ds, "all", NULL, NULL, &err), ISB_OK, NULL);
    CHECK("split length, unknown split", isb_dataset_split_len(ds, "holdout", &samples, NULL, &err), ISB_INVALID_ARGUMENT, "holdout");
    CHECK("split length, empty split", isb_dataset_split_len(ds, "val", NULL, &batches, &err), ISB_INVALID_ARGUMENT, "val");
    CHECK("split length, NULL split", isb_dataset_split_len(ds, NULL, NULL, NULL, &err), ISB_NULL_POINTER, "split");
    /* An epoch's order before it runs (ABI 11): lengths first, then the arrays; it is the
     * order the iteration then emits, and a short array is named. */
    {
        size_t n = 0, nb = 0;
        uint64_t order[12] = {0}, ends[12] = {0}, short_ends[1] = {0};
        CHECK("order lengths", isb_dataset_order(ds, "train", NULL, 0, &n, NULL, 0, &nb, &err), ISB_OK, NULL);
        if (n != 12 || nb < 1 || nb > 12) {
            fprintf(stderr, "FAIL order lengths: %zu samples, %zu blocks\n", n, nb);
            failures++;
        }
        CHECK("order, short samples", isb_dataset_order(ds, "train", order, 11, NULL, NULL, 0, NULL, &err), ISB_INVALID_ARGUMENT, "`samples` holds 11 values");
        if (nb > 1)
            CHECK("order, short block_ends", isb_dataset_order(ds, "train", order, 12, NULL, short_ends, 1, NULL, &err), ISB_INVALID_ARGUMENT, "block_ends");
        if (order[0] != 0 || short_ends[0] != 0) {
            fprintf(stderr, "FAIL order: a refused call wrote its arrays\n");
            failures++;
        }
        CHECK("order", isb_dataset_order(ds, "train", order, 12, &n, ends, 12, &nb, &err), ISB_OK, NULL);
        if (nb == 0 || ends[nb - 1] != 12) {
            fprintf(stderr, "FAIL order: the last block ends at %llu, want 12\n", nb ? (unsigned long long)ends[nb - 1] : 0ull);
            failures++;
        }
        IsbIter *oit = NULL;
        IsbBatch *ob = NULL;
        const uint64_t *idx = NULL;
        size_t len = 0, at = 0;
        if (isb_iter_start(ds, "train", &oit, &err) != ISB_OK) return 1;
        while (isb_iter_next(oit, &ob, &err) == ISB_OK) {
            if (isb_batch_sample_indices(ob, &idx, &len, &err) != ISB_OK || at + len > 12 ||
                memcmp(idx, order + at, len * sizeof *idx) != 0) {
                fprintf(stderr, "FAIL order: the batch at row %zu is not the order's next rows\n", at);
                failures++;
            }
            at += len;
            isb_batch_free(ob);
        }
        isb_iter_free(oit);
        if (at != 12) {
            fprintf(stderr, "FAIL order: the epoch emitted %zu samples, want 12\n", at);
            failures++;
        }
        CHECK("order, unknown split", isb_dataset_order(ds, "holdout", NULL, 0, NULL, NULL, 0, NULL, &err), ISB_INVALID_ARGUMENT, "holdout");
        CHECK("order, NULL split", isb_dataset_order(ds, NULL, NULL, 0, NULL, NULL, 0, NULL, &err), ISB_NULL_POINTER, "split");
        CHECK("order, NULL dataset", isb_dataset_order(NULL, "train", NULL, 0, NULL, NULL, 0, NULL, &err), ISB_NULL_POINTER, "ds");
    }
    /* The memory a pass holds at its peak, before it starts (ABI 6): three batches (the epoch
     * has three, fewer than prefetch_depth + 2), above the library's own 16 MiB. */
    char *need = NULL;
    CHECK("memory need", isb_dataset_memory_json(ds, "train", &need, &err), ISB_OK, NULL);
    unsigned long long total = 0, overhead = 0;
    const char *total_at = need ? strstr(need, "\"total_bytes\":") : NULL;
    const char *overhead_at = need ? strstr(need, "\"overhead_bytes\":") : NULL;
    if (!total_at || !overhead_at || sscanf(total_at, "\"total_bytes\":%llu", &total) != 1 ||
        sscanf(overhead_at, "\"overhead_bytes\":%llu", &overhead) != 1 || overhead < (16ull << 20) ||
        total <= overhead || !strstr(need, "\"batches\":3,") || !strstr(need, "\"fits\":true") ||
        !strstr(need, "\"process_rss_bytes\":") || strstr(need, "\"process_rss_bytes\":0,") ||
        !strstr(need, "\"other_passes\":0,") || !strstr(need, "\"others_bytes\":0,")) {
        fprintf(stderr, "FAIL memory need: %s\n", need ? need : "(null)");
        failures++;
    }
    isb_string_free(need);
    CHECK("memory need, unknown split", isb_dataset_memory_json(ds, "holdout", &need, &err), ISB_INVALID_ARGUMENT, "holdout");
    CHECK("memory need, NULL split", isb_dataset_memory_json(ds, NULL, &need, &err), ISB_NULL_POINTER, "split");
    CHECK("memory need, NULL out_json", isb_dataset_memory_json(ds, "train", NULL, &err), ISB_NULL_POINTER, "`out_json`");
    CHECK("memory need, NULL dataset", isb_dataset_memory_json(NULL, "train", &need, &err), ISB_NULL_POINTER, "ds");
    IsbIter *it = NULL;
    /* Resuming an epoch (ABI 7): from batch 2 of 3 comes the whole epoch's last batch, from
     * batch 3 nothing, and batch 4 is named as out of range. */
    {
        uint64_t last[5] = {0};
        size_t n_last = 0;
        IsbBatch *rb = NULL;
        const uint64_t *idx = NULL;
        size_t len = 0;
        if (isb_iter_start(ds, "train", &it, &err) != ISB_OK) return 1;
        while (isb_iter_next(it, &rb, &err) == ISB_OK) {
            if (isb_batch_sample_indices(rb, &idx, &len, &err) == ISB_OK && len <= 5) {
                memcpy(last, idx, len * sizeof *idx);
                n_last = len;
            }
            isb_batch_free(rb);
        }
        isb_iter_free(it);
        CHECK("resume at the last batch", isb_iter_start_at(ds, "train", 2, &it, &err), ISB_OK, NULL);
        if (isb_iter_next(it, &rb, &err) != ISB_OK ||
            isb_batch_sample_indices(rb, &idx, &len, &err) != ISB_OK || len != n_last ||
            memcmp(idx, last, len * sizeof *idx) != 0) {
            fprintf(stderr, "FAIL resumed batch 2 is not the epoch's last batch\n");
            failures++;
        }
        /* A resumed batch knows its place in the whole epoch (ABI 12). */
        uint64_t epoch = 99, index = 99;
        CHECK("position", isb_batch_position(rb, &epoch, &index, &err), ISB_OK, NULL);
        if (epoch != 0 || index != 2) {
            fprintf(stderr, "FAIL resumed batch at (epoch %llu, index %llu), want (0, 2)\n",
                    (unsigned long long)epoch, (unsigned long long)index);
            failures++;
        }
        CHECK("position, NULL batch", isb_batch_position(NULL, &epoch, &index, &err), ISB_NULL_POINTER, "`b`");
        CHECK("position, NULL epoch", isb_batch_position(rb, NULL, &index, &err), ISB_NULL_POINTER, "`epoch`");
        CHECK("position, NULL index", isb_batch_position(rb, &epoch, NULL, &err), ISB_NULL_POINTER, "`index`");
        CHECK("sample indices, NULL batch", isb_batch_sample_indices(NULL, &idx, &len, &err), ISB_NULL_POINTER, "`b`");
        CHECK("sample indices, NULL out", isb_batch_sample_indices(rb, NULL, &len, &err), ISB_NULL_POINTER, "`out`");
        CHECK("sample indices, NULL len", isb_batch_sample_indices(rb, &idx, NULL, &err), ISB_NULL_POINTER, "`len`");
        isb_batch_free(rb);
        CHECK("resumed epoch ends", isb_iter_next(it, &rb, &err), ISB_END_OF_EPOCH, NULL);
        isb_iter_free(it);
        CHECK("resume after the last batch", isb_iter_start_at(ds, "train", 3, &it, &err), ISB_OK, NULL);
        CHECK("nothing after the last batch", isb_iter_next(it, &rb, &err), ISB_END_OF_EPOCH, NULL);
        isb_iter_free(it);
        it = NULL;
        CHECK("resume past the epoch", isb_iter_start_at(ds, "train", 4, &it, &err), ISB_INVALID_ARGUMENT, "start_batch");
    }
    CHECK("unknown split", isb_iter_start(ds, "holdout", &it, &err), ISB_INVALID_ARGUMENT, "holdout");
    CHECK("empty split", isb_iter_start(ds, "val", &it, &err), ISB_INVALID_ARGUMENT, "val");
    CHECK("NULL dataset", isb_iter_start(NULL, "train", &it, &err), ISB_NULL_POINTER, "ds");
    CHECK("NULL iter", isb_iter_next(NULL, NULL, &err), ISB_NULL_POINTER, "out");
    CHECK("NULL iter, bounded wait", isb_iter_next_timeout(NULL, 10, NULL, &err), ISB_NULL_POINTER, "out");

    if (isb_iter_start(ds, "train", &it, &err) != ISB_OK) return 1;
    IsbBatch *b = NULL;
    if (isb_iter_next(it, &b, &err) != ISB_OK) return 1;
    /* A second iteration's need counts the running one beside it. */
    CHECK("memory need beside a pass", isb_dataset_memory_json(ds, "all", &need, &err), ISB_OK, NULL);
    if (!need || !strstr(need, "\"other_passes\":1,") || strstr(need, "\"others_bytes\":0,")) {
        fprintf(stderr, "FAIL memory need beside a running pass: %s\n", need ? need : "(null)");
        failures++;
    }
    isb_string_free(need);
    DLManagedTensorVersioned *t = NULL;
    CHECK("unknown label", isb_batch_export(b, "nope", &t, &err), ISB_INVALID_ARGUMENT, "nope");
    const char *label = NULL;
    CHECK("label index", isb_batch_label(b, 99, &label, &err), ISB_INVALID_ARGUMENT, "99");
    /* An exported tensor outlives its batch, its iteration and its dataset. */
    isb_batch_label(b, 0, &label, NULL);
    if (isb_batch_export(b, label, &t, &err) != ISB_OK) return 1;
    if (t->version.major != 1 || t->dl_tensor.device.device_type != 1 || t->dl_tensor.strides != NULL ||
        ((uintptr_t)t->dl_tensor.data % 256) != 0) {
        fprintf(stderr, "FAIL DLPack fields\n");
        failures++;
    }
    float first = ((const float *)t->dl_tensor.data)[0];
    isb_batch_free(b);
    isb_iter_free(it);   /* stops the epoch early */
    isb_dataset_free(ds);
    if (((const float *)t->dl_tensor.data)[0] != first) {
        fprintf(stderr, "FAIL tensor data changed after its owners were freed\n");
        failures++;
    }
    t->deleter(t);

    /* A corrupt chunk: the error names the key; `next` after it says the iteration failed. */
    snprintf(config, sizeof config, "{\"store\": \"%s\", \"batch_size\": 2}", argv[2]);
    if (isb_dataset_open(config, &ds, &err) != ISB_OK) {
        fprintf(stderr, "open corrupt: %s\n", isb_error_message(err));
        return 1;
    }
    if (isb_iter_start(ds, "all", &it, &err) != ISB_OK) return 1;
    IsbStatus st;
    /* Bounded waits: a slice that ends before its batch is ISB_TIMED_OUT and loses nothing. */
    size_t rows = 0;
    while ((st = isb_iter_next_timeout(it, 5, &b, &err)) == ISB_OK || st == ISB_TIMED_OUT) {
        if (st == ISB_OK) {
            size_t n = 0;
            isb_batch_len(b, &n, NULL);
            rows += n;
            isb_batch_free(b);
        } else if (b != NULL) {
            fprintf(stderr, "FAIL a timed-out wait handed out a batch\n");
            failures++;
        }
    }
    expect("corrupt chunk", st, ISB_BAD_DATA, err, "c/1/0/0");
    err = NULL; /* freed by expect */
    if (rows > 4) { /* at most samples 0..4 precede the corrupt chunk c/1/0/0 (samples 4..8) */
        fprintf(stderr, "FAIL %zu rows before the corrupt chunk, at most 4 exist\n", rows);
        failures++;
    }
    CHECK("next after an error", isb_iter_next(it, &b, &err), ISB_CANCELLED, "failed earlier");
    CHECK("bounded next after an error", isb_iter_next_timeout(it, 0, &b, &err), ISB_CANCELLED, "failed earlier");
    isb_iter_free(it);
    isb_dataset_free(ds);

    /* The NVMe tier: one writer per cache_dir (status 13 names the holder), readonly readers
     * revive without decoding, and a readonly reader over no cache is an IO error naming it. */
    const char *cache = argv[3];
    IsbDataset *writer = NULL, *second = NULL;
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"cache_dir\": \"%s\", \"persist\": true}",
             store, cache);
    if (isb_dataset_open(config, &writer, &err) != ISB_OK) {
        fprintf(stderr, "open cache writer: %s\n", isb_error_message(err));
        return 1;
    }
    CHECK("second writer", isb_dataset_open(config, &second, &err), ISB_CACHE_LOCKED, "pid ");
    if (isb_iter_start(writer, "all", &it, &err) != ISB_OK) return 1;
    while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) isb_batch_free(b);
    expect("warm epoch", st, ISB_END_OF_EPOCH, err, "");
    err = NULL;
    isb_iter_free(it);
    isb_dataset_free(writer);
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"variables\": [\"t2m\"], \"cache_dir\": \"%s\", \"readonly_cache\": true}",
             store, cache);
    if (isb_dataset_open(config, &ds, &err) != ISB_OK) {
        fprintf(stderr, "open cache reader: %s\n", isb_error_message(err));
        return 1;
    }
    if (isb_iter_start(ds, "all", &it, &err) != ISB_OK) return 1;
    while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) isb_batch_free(b);
    expect("readonly epoch", st, ISB_END_OF_EPOCH, err, "");
    err = NULL;
    char *stats = NULL;
    if (isb_iter_stats_json(it, &stats, &err) != ISB_OK) return 1;
    if (!strstr(stats, "\"cache_revived\":3") || !strstr(stats, "\"tiles_read\":0")) {
        fprintf(stderr, "FAIL readonly epoch stats: %s\n", stats);
        failures++;
    }
    isb_string_free(stats);
    isb_iter_free(it);
    isb_dataset_free(ds);
    snprintf(config, sizeof config,
             "{\"store\": \"%s\", \"cache_dir\": \"%s/never-warmed\", \"readonly_cache\": true}",
             store, cache);
    CHECK("readonly over nothing", isb_dataset_open(config, &ds, &err), ISB_IO, "never-warmed");

    /* Every _free accepts NULL, and so do the error accessors. */
    isb_dataset_free(NULL);
    isb_iter_free(NULL);
    isb_batch_free(NULL);
    isb_error_free(NULL);
    isb_string_free(NULL);
    if (isb_error_status(NULL) != ISB_INTERNAL || strcmp(isb_error_message(NULL), "") != 0) failures++;
    if (failures == 0) printf("ok\n");
    return failures ? 1 : 0;
}
