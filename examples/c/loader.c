/* A simulation-code-shaped program that embeds insitubatch: open a store, split it, run two
 * shuffled epochs over the train split, and print an order-independent checksum of every value
 * delivered. Build (see README):
 *   cc examples/c/loader.c -Ibindings/c/include -Ltarget/release -linsitubatch \
 *      -Wl,-rpath,$PWD/target/release -o loader && ./loader STORE
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "insitubatch.h"

static int fail(const char *what, IsbError *err) {
    fprintf(stderr, "%s failed: %s\n", what, isb_error_message(err));
    isb_error_free(err);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE\n", argv[0]);
        return 2;
    }
    if (isb_abi_version() != ISB_ABI_VERSION) {
        fprintf(stderr, "libinsitubatch ABI %u, header %u: rebuild\n", isb_abi_version(), ISB_ABI_VERSION);
        return 2;
    }
    IsbError *err = NULL;
    char *manifest = NULL;
    if (isb_split_by_chunk(argv[1], NULL, "{\"fractions\": [0.75, 0.25]}", &manifest, &err) != ISB_OK)
        return fail("isb_split_by_chunk", err);

    /* Every dataset argument travels in one JSON config. */
    size_t n = strlen(argv[1]) + strlen(manifest) + 256;
    char *config = malloc(n);
    snprintf(config, n, "{\"store\": \"%s\", \"manifest\": %s, \"batch_size\": 8, \"seed\": 7}",
             argv[1], manifest);
    isb_string_free(manifest);
    IsbDataset *ds = NULL;
    IsbStatus st = isb_dataset_open(config, &ds, &err);
    free(config);
    if (st != ISB_OK) return fail("isb_dataset_open", err);

    uint64_t bits = 0, samples = 0, index_sum = 0;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        isb_dataset_set_epoch(ds, epoch, NULL);
        IsbIter *it = NULL;
        if (isb_iter_start(ds, "train", &it, &err) != ISB_OK) return fail("isb_iter_start", err);
        IsbBatch *b = NULL;
        while ((st = isb_iter_next(it, &b, &err)) == ISB_OK) {
            size_t labels = 0, len = 0;
            const uint64_t *idx = NULL;
            isb_batch_label_count(b, &labels, NULL);
            isb_batch_sample_indices(b, &idx, &len, NULL);
            samples += len;
            for (size_t i = 0; i < len; i++) index_sum += idx[i];
            for (size_t l = 0; l < labels; l++) {
                const char *label = NULL;
                DLManagedTensorVersioned *t = NULL;
                isb_batch_label(b, l, &label, NULL);
                if (isb_batch_export(b, label, &t, &err) != ISB_OK) return fail("isb_batch_export", err);
                size_t count = 1;
                for (int d = 0; d < t->dl_tensor.ndim; d++) count *= (size_t)t->dl_tensor.shape[d];
                /* float32 fields: sum the bit patterns, so the order of batches does not matter. */
                const uint32_t *v = (const uint32_t *)t->dl_tensor.data;
                for (size_t i = 0; i < count; i++) bits += v[i];
                t->deleter(t);
            }
            isb_batch_free(b);
        }
        if (st != ISB_END_OF_EPOCH) return fail("isb_iter_next", err);
        isb_iter_free(it);
    }
    isb_dataset_free(ds);
    printf("samples %" PRIu64 " index_sum %" PRIu64 " checksum %" PRIu64 "\n", samples, index_sum, bits);
    return 0;
}
